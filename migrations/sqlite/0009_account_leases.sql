-- Several daemons on one database (twin of
-- migrations/postgres/0009_account_leases.sql). SQLite is one daemon per
-- file; the tables exist so both schemas stay alike and the lease store
-- calls behave the same in tests.
CREATE TABLE nodes (
    node_id     TEXT    NOT NULL PRIMARY KEY,
    instance    TEXT    NOT NULL,
    control_url TEXT,
    expires_at  INTEGER NOT NULL
);
CREATE TABLE account_leases (
    account_id TEXT    NOT NULL PRIMARY KEY REFERENCES accounts (id) ON DELETE CASCADE,
    node_id    TEXT    NOT NULL,
    epoch      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);
CREATE INDEX account_leases_node ON account_leases (node_id);
