-- Downstream tokens (docs/DOWNSTREAM.md): the audit trail's kinds for a token exchange sent to an authorization
-- server ('exchange') and a third party's authorization for a user ('authorize').
--
-- An 'exchange' row: principal = the caller's opaque key, client_id = the caller's client, tool = the downstream's
-- configured name, outcome = issued, refused, unavailable or invalid_response, duration_us = the request to the
-- authorization server, trace_id = the call that needed the token, detail = "lifetime Ns" when a token was issued.
-- Never a token. The rows are hashed and chained like every other.
ALTER TABLE audit_events DROP CONSTRAINT audit_events_kind_check;
ALTER TABLE audit_events ADD CONSTRAINT audit_events_kind_check
    CHECK (kind IN ('call', 'dropped', 'end', 'policy', 'revoke', 'exchange', 'authorize'));
