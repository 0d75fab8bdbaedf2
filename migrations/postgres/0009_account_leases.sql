-- Several daemons on one database (twin of
-- migrations/sqlite/0009_account_leases.sql).
--
-- `nodes`: the daemons alive now. A daemon renews its row while it runs;
-- `instance` is drawn at each start, so a second daemon started with the
-- same node id is refused while the first one's row is live.
CREATE TABLE nodes (
    node_id     TEXT        NOT NULL PRIMARY KEY,
    instance    TEXT        NOT NULL,
    control_url TEXT,
    expires_at  TIMESTAMPTZ NOT NULL
);
-- `account_leases`: which daemon owns an account, until when, and the
-- fencing epoch, which grows each time the lease is taken anew. A mark or a
-- send carrying an older epoch is refused. Expiry is read on the database's
-- clock, so the daemons' clocks need not agree.
CREATE TABLE account_leases (
    account_id TEXT        NOT NULL PRIMARY KEY REFERENCES accounts (id) ON DELETE CASCADE,
    node_id    TEXT        NOT NULL,
    epoch      BIGINT      NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX account_leases_node ON account_leases (node_id);
