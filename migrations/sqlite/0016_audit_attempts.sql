-- Attempts that prove no identity (a wrong token, a failed console
-- sign-in) are audited too, with no role, and counted per client address
-- and minute into one entry (`count`), so a flood cannot fill the disk.
-- SQLite cannot drop a NOT NULL: the table is rebuilt.
CREATE TABLE audit_log_new (
    id         INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    at         INTEGER NOT NULL,
    actor      TEXT    NOT NULL,
    actor_id   INTEGER,
    role       TEXT,
    via        TEXT    NOT NULL,
    operation  TEXT    NOT NULL,
    method     TEXT    NOT NULL,
    path       TEXT    NOT NULL,
    resource   TEXT,
    summary    TEXT    NOT NULL,
    status     INTEGER NOT NULL,
    remote     TEXT    NOT NULL,
    count      INTEGER NOT NULL DEFAULT 1
) STRICT;
INSERT INTO audit_log_new (id, at, actor, actor_id, role, via, operation, method, path,
                           resource, summary, status, remote)
SELECT id, at, actor, actor_id, role, via, operation, method, path, resource, summary,
       status, remote
FROM audit_log;
-- Ids are never reused, even those of entries already pruned.
UPDATE sqlite_sequence
SET seq = MAX(seq, COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'audit_log'), 0))
WHERE name = 'audit_log_new';
DROP TABLE audit_log;
ALTER TABLE audit_log_new RENAME TO audit_log;
CREATE INDEX audit_log_at ON audit_log (at);
