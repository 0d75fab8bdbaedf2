-- Console sign-ins, so a restart (or another daemon of a cluster) keeps
-- the operator signed in until the session expires. The session id is
-- kept only as its SHA-256: a copy of the database opens no session.
CREATE TABLE console_sessions (
    id_hash    TEXT NOT NULL PRIMARY KEY,
    csrf       TEXT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX console_sessions_expiry ON console_sessions (expires_at);
