-- Policy as data (docs/POLICY.md): every version of the fleet's policy document applied with `mcpfleet policy
-- apply` or `rollback`, stored whole, with who applied it, when, and a one-line summary of what it changed; and the
-- audit trail's kinds for policy changes and revocations.
--
-- Redis holds the version in force (what the replicas read); this table holds every version (what `policy history`
-- lists and `policy rollback` restores). Versions are numbered here, one more than the highest before (or than the
-- version in force in Redis, when that is higher), under an advisory lock.
CREATE TABLE policy_versions (
    version     bigint      PRIMARY KEY CHECK (version >= 1),
    document    text        NOT NULL CHECK (octet_length(document) <= 1048576),
    sha256      text        NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    applied_by  text        NOT NULL CHECK (length(applied_by) BETWEEN 1 AND 200),
    applied_at  timestamptz NOT NULL DEFAULT now(),
    summary     text        NOT NULL CHECK (length(summary) <= 400),
    -- The version a rollback restored; NULL for a document applied from a file.
    rollback_of bigint      REFERENCES policy_versions (version)
);

-- The audit trail's new kinds: 'policy' (a version applied or rolled back: principal = who, outcome = applied or
-- rolled_back, args_sha256 = the document's SHA-256, result_bytes = its size, detail = "version N: summary") and
-- 'revoke' (a principal's or a token's revocation, or its lifting). `detail` is hashed only when it is set, so the
-- rows written before it keep their hashes.
ALTER TABLE audit_events DROP CONSTRAINT audit_events_kind_check;
ALTER TABLE audit_events ADD CONSTRAINT audit_events_kind_check
    CHECK (kind IN ('call', 'dropped', 'end', 'policy', 'revoke'));
ALTER TABLE audit_events ADD COLUMN detail text CHECK (length(detail) <= 1000);
