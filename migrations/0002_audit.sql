-- The audit trail of tool calls: one row per tools/call outcome, chained per replica for tamper evidence.
--
-- Each replica's writer keeps one chain per process (chain_id = replica / start): every row carries the SHA-256
-- of the chain's previous row (prev_hash; 32 zero bytes for the first) and its own (hash, over prev_hash and the
-- row's content). `mcpfleet audit verify` recomputes them. Kinds: 'call' (a tools/call), 'dropped' (the writer's
-- queue was full: `dropped` calls were counted and not kept), 'end' (the replica drained: the chain is closed).
--
-- The table is partitioned by month of `at` (UTC). The server and `migrate` create partitions ahead; retention
-- drops whole partitions, after writing each chain's last row in the partition to audit_checkpoints, where verify
-- starts from.
CREATE TABLE audit_events (
    chain_id     text        NOT NULL CHECK (length(chain_id) BETWEEN 1 AND 200),
    seq          bigint      NOT NULL CHECK (seq >= 1),
    at           timestamptz NOT NULL,
    kind         text        NOT NULL CHECK (kind IN ('call', 'dropped', 'end')),
    replica      text        NOT NULL,
    principal    text,
    client_id    text,
    tool         text,
    outcome      text,
    duration_us  bigint      CHECK (duration_us >= 0),
    trace_id     text,
    args_sha256  text,
    result_bytes bigint      CHECK (result_bytes >= 0),
    generation   text,
    dropped      bigint      CHECK (dropped >= 1),
    prev_hash    bytea       NOT NULL CHECK (length(prev_hash) = 32),
    hash         bytea       NOT NULL CHECK (length(hash) = 32),
    PRIMARY KEY (chain_id, seq, at)
) PARTITION BY RANGE (at);

-- "What did this principal's agent do yesterday": by principal and time. A time range alone is served by the
-- monthly partitions (an export reads whole months); one index less to maintain on every insert.
CREATE INDEX audit_events_principal_at ON audit_events (principal, at);

-- The last row of each chain in a partition that retention dropped: verify continues each chain from here.
CREATE TABLE audit_checkpoints (
    chain_id   text        NOT NULL,
    seq        bigint      NOT NULL,
    hash       bytea       NOT NULL CHECK (length(hash) = 32),
    at         timestamptz NOT NULL,
    ended      boolean     NOT NULL,
    partition  text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (chain_id, seq)
);
