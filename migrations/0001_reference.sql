-- 0001_reference: the domain of the reference tools (crates/reference), shared by every replica.
--
-- Applied once, inside a transaction, by the migration runner (which records it): no BEGIN/COMMIT here and no
-- bookkeeping table of our own.
--
-- Every domain row carries `tenant`. Ids are unique per tenant (composite primary keys), and every reference
-- between domain rows is a composite foreign key `(tenant, ...)`, so a row can only point at rows of its own
-- tenant. The money rules live here, not only in Rust:
--   * a refund draft is born a draft, for at most what is left to refund on its order (trigger);
--   * a draft only moves draft -> confirmed | cancelled | expired, once, and its id, tenant, order, owner and
--     amount never change (trigger);
--   * an order's refunded_cents stays within 0..amount_cents (CHECK), so a confirmation that adds a draft's
--     amount to it cannot over-refund the order, whatever raced it.
-- The errors the triggers raise are check violations (SQLSTATE 23514) naming the rule as their constraint.

-- The tenants that have data. `demo` marks the generated demo tenants (demo-0001, ...), which a development
-- server may assign to callers whose tenant has no row here.
CREATE TABLE tenants (
    id   text PRIMARY KEY CHECK (id <> '' AND length(id) <= 200),
    name text NOT NULL,
    demo boolean NOT NULL DEFAULT false
);
-- The list of demo tenants, by id.
CREATE INDEX tenants_demo_idx ON tenants (id) WHERE demo;

-- get_customer_summary: looked up by (tenant, id), the primary key.
CREATE TABLE customers (
    tenant text NOT NULL REFERENCES tenants (id),
    id     text NOT NULL CONSTRAINT customers_id_format CHECK (id ~ '^[A-Za-z0-9_-]{1,36}$'),
    name   text NOT NULL,
    plan   text NOT NULL CONSTRAINT customers_plan CHECK (plan IN ('team', 'enterprise')),
    note   text NOT NULL DEFAULT '',
    PRIMARY KEY (tenant, id)
);

-- create_refund_draft: looked up by (tenant, id), the primary key. refunded_cents is the sum of the confirmed
-- drafts' amounts (plus whatever was refunded before the drafts existed).
CREATE TABLE orders (
    tenant         text NOT NULL,
    id             text NOT NULL CONSTRAINT orders_id_format CHECK (id ~ '^ord_[0-9]{1,16}$'),
    customer_id    text NOT NULL,
    amount_cents   bigint NOT NULL CONSTRAINT orders_amount_positive CHECK (amount_cents > 0),
    refunded_cents bigint NOT NULL DEFAULT 0
        CONSTRAINT orders_refunded_within_amount CHECK (refunded_cents >= 0 AND refunded_cents <= amount_cents),
    PRIMARY KEY (tenant, id),
    FOREIGN KEY (tenant, customer_id) REFERENCES customers (tenant, id)
);
-- The customer's orders (and the foreign key's checks when a customer is deleted).
CREATE INDEX orders_customer_idx ON orders (tenant, customer_id);

-- get_ticket: by (tenant, id), the primary key, or by the external reference (tenant, project, number), unique.
CREATE TABLE tickets (
    tenant      text NOT NULL,
    id          text NOT NULL CONSTRAINT tickets_id_format CHECK (id ~ '^TKT-[0-9]{1,8}$'),
    project     text NOT NULL CONSTRAINT tickets_project CHECK (project IN ('billing', 'support', 'security')),
    number      integer NOT NULL CONSTRAINT tickets_number_range CHECK (number BETWEEN 1 AND 99999999),
    status      text NOT NULL DEFAULT 'open' CONSTRAINT tickets_status CHECK (status IN ('open', 'closed')),
    customer_id text,
    title       text NOT NULL,
    body        text NOT NULL,
    PRIMARY KEY (tenant, id),
    CONSTRAINT tickets_external_reference UNIQUE (tenant, project, number),
    FOREIGN KEY (tenant, customer_id) REFERENCES customers (tenant, id)
);
-- A customer's open tickets (get_customer_summary counts them), and the foreign key's checks.
CREATE INDEX tickets_customer_idx ON tickets (tenant, customer_id, status);

-- search_docs: full-text search over title (weight A) and body (weight B) of the tenant's documents.
CREATE TABLE documents (
    tenant text NOT NULL REFERENCES tenants (id),
    id     text NOT NULL,
    title  text NOT NULL,
    body   text NOT NULL,
    search tsvector GENERATED ALWAYS AS (
        setweight(to_tsvector('english', title), 'A') || setweight(to_tsvector('english', body), 'B')
    ) STORED,
    PRIMARY KEY (tenant, id)
);
-- `search @@ websearch_to_tsquery('english', $q)`, combined with the primary key's (tenant) prefix.
CREATE INDEX documents_search_idx ON documents USING gin (search);

-- The refund drafts of create_refund_draft / confirm_refund_draft. The id is server-minted and globally unique;
-- every lookup is by id AND tenant AND owner (the principal that created it: a draft is its creator's alone).
CREATE TABLE refund_drafts (
    id           text PRIMARY KEY CONSTRAINT refund_drafts_id_format CHECK (id ~ '^drf_[0-9a-f]{24}$'),
    tenant       text NOT NULL,
    order_id     text NOT NULL,
    owner        text NOT NULL CONSTRAINT refund_drafts_owner_present CHECK (owner <> ''),
    amount_cents bigint NOT NULL CONSTRAINT refund_drafts_amount_positive CHECK (amount_cents > 0),
    status       text NOT NULL DEFAULT 'draft'
        CONSTRAINT refund_drafts_status CHECK (status IN ('draft', 'confirmed', 'cancelled', 'expired')),
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- Drafts expire 24 h after creation (crates/reference: DRAFT_TTL).
    expires_at   timestamptz NOT NULL DEFAULT now() + interval '24 hours',
    confirmed_at timestamptz,
    CONSTRAINT refund_drafts_expiry_after_creation CHECK (expires_at > created_at),
    CONSTRAINT refund_drafts_confirmed_at CHECK ((status = 'confirmed') = (confirmed_at IS NOT NULL)),
    FOREIGN KEY (tenant, order_id) REFERENCES orders (tenant, id)
);
-- The drafts of an order (the foreign key's checks when orders are deleted; removing a tenant's drafts).
CREATE INDEX refund_drafts_order_idx ON refund_drafts (tenant, order_id);

-- A new draft is a draft, and asks for no more than the order's refundable remainder. The order row is read
-- FOR SHARE: a confirmation of another draft of the same order (which updates that row) cannot commit between
-- this check and the end of the inserting transaction. A missing order is left to the foreign key.
CREATE FUNCTION refund_drafts_before_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    remaining bigint;
BEGIN
    IF NEW.status <> 'draft' OR NEW.confirmed_at IS NOT NULL THEN
        RAISE EXCEPTION 'a refund draft is created in status draft, unconfirmed'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'refund_drafts_born_draft';
    END IF;
    SELECT o.amount_cents - o.refunded_cents INTO remaining
      FROM orders o
     WHERE o.tenant = NEW.tenant AND o.id = NEW.order_id
       FOR SHARE;
    IF FOUND AND NEW.amount_cents > remaining THEN
        RAISE EXCEPTION 'a refund draft of % cents exceeds the % cents left to refund on its order',
                        NEW.amount_cents, remaining
            USING ERRCODE = 'check_violation', CONSTRAINT = 'refund_drafts_within_remainder';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER refund_drafts_before_insert
    BEFORE INSERT ON refund_drafts
    FOR EACH ROW EXECUTE FUNCTION refund_drafts_before_insert();

-- What a draft is never changes; its status moves once, out of 'draft'; a settled draft (confirmed, cancelled,
-- expired) does not change at all.
CREATE FUNCTION refund_drafts_before_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id IS DISTINCT FROM OLD.id
       OR NEW.tenant IS DISTINCT FROM OLD.tenant
       OR NEW.order_id IS DISTINCT FROM OLD.order_id
       OR NEW.owner IS DISTINCT FROM OLD.owner
       OR NEW.amount_cents IS DISTINCT FROM OLD.amount_cents THEN
        RAISE EXCEPTION 'the id, tenant, order, owner and amount of a refund draft never change'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'refund_drafts_immutable';
    END IF;
    IF NEW.status IS DISTINCT FROM OLD.status
       AND NOT (OLD.status = 'draft' AND NEW.status IN ('confirmed', 'cancelled', 'expired')) THEN
        RAISE EXCEPTION 'a refund draft cannot go from % to %', OLD.status, NEW.status
            USING ERRCODE = 'check_violation', CONSTRAINT = 'refund_drafts_status_transition';
    END IF;
    IF OLD.status <> 'draft' AND NEW IS DISTINCT FROM OLD THEN
        RAISE EXCEPTION 'a % refund draft does not change', OLD.status
            USING ERRCODE = 'check_violation', CONSTRAINT = 'refund_drafts_settled';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER refund_drafts_before_update
    BEFORE UPDATE ON refund_drafts
    FOR EACH ROW EXECUTE FUNCTION refund_drafts_before_update();

-- export_report: by (tenant, id), the primary key. `rows` is an array of {"metric": text, "value": integer}, in
-- the order the export prints them.
CREATE TABLE exports (
    tenant text NOT NULL REFERENCES tenants (id),
    id     text NOT NULL CONSTRAINT exports_id_format CHECK (id ~ '^rep_[a-z0-9]{1,16}$'),
    title  text NOT NULL,
    ready  boolean NOT NULL DEFAULT false,
    rows   jsonb NOT NULL DEFAULT '[]' CONSTRAINT exports_rows_array CHECK (jsonb_typeof(rows) = 'array'),
    PRIMARY KEY (tenant, id)
);
