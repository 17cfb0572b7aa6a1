//! The policy crate's one error: why a document is refused, with the JSON pointer of the place in it.

/// Why a policy document is refused. The whole document is refused: nothing of it applies.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// Not YAML, or YAML with a duplicate key.
    #[error("not a policy document: {0}")]
    Syntax(String),
    /// A place the document's schema refuses (docs/policy.schema.json): an unknown key, a wrong type, a bound.
    #[error("{pointer}: expected {expected}")]
    Schema { pointer: String, expected: String },
    /// A CEL expression that does not compile, or uses a variable its rule does not have.
    #[error("{pointer}: {message}")]
    Expression { pointer: String, message: String },
    /// A reference to something the document does not define (a plan).
    #[error("{pointer}: {message}")]
    Reference { pointer: String, message: String },
}

impl PolicyError {
    /// The JSON pointer of the place refused (empty for a syntax error).
    #[must_use]
    pub fn pointer(&self) -> &str {
        match self {
            Self::Syntax(_) => "",
            Self::Schema { pointer, .. } | Self::Expression { pointer, .. } | Self::Reference { pointer, .. } => {
                pointer
            }
        }
    }
}
