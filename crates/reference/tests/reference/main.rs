//! The reference tools' integration tests, in one binary: their cases through the validator and through a
//! replica's pipeline (`cases`), and `PgRepo` against a real PostgreSQL (`pg`).

mod cases;
mod pg;
