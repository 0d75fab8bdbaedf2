-- Named API users, each with one token (kept only as its SHA-256) and one
-- role; the daemon's own control.token stays the first admin outside this
-- table.
CREATE TABLE api_users (
    id         BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       TEXT        NOT NULL UNIQUE,
    role       TEXT        NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    token_hash TEXT        NOT NULL UNIQUE,
    created_at TIMESTAMPTZ NOT NULL,
    expires_at TIMESTAMPTZ,
    created_by TEXT        NOT NULL
);

-- A console sign-in belongs to whoever signed in; sessions from before
-- users existed were opened with the daemon's token, so they are admin.
ALTER TABLE console_sessions ADD COLUMN user_id BIGINT;
ALTER TABLE console_sessions ADD COLUMN user_name TEXT NOT NULL DEFAULT 'control.token';
ALTER TABLE console_sessions ADD COLUMN role TEXT NOT NULL DEFAULT 'admin';
CREATE INDEX console_sessions_user ON console_sessions (user_id);

-- Every write through the API or the console: who, when, what, from where.
CREATE TABLE audit_log (
    id         BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         TIMESTAMPTZ NOT NULL,
    actor      TEXT        NOT NULL,
    actor_id   BIGINT,
    role       TEXT        NOT NULL,
    via        TEXT        NOT NULL,
    operation  TEXT        NOT NULL,
    method     TEXT        NOT NULL,
    path       TEXT        NOT NULL,
    resource   TEXT,
    summary    TEXT        NOT NULL,
    status     BIGINT      NOT NULL,
    remote     TEXT        NOT NULL
);
CREATE INDEX audit_log_at ON audit_log (at);
