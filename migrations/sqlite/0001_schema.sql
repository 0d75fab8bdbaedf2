-- Herald schema, SQLite dialect (twin of migrations/postgres/0001_schema.sql).
--
-- Instants are INTEGER microseconds since the Unix epoch, in UTC. Integers
-- sort and compare correctly (text timestamps only do at a fixed width and
-- offset), are compact, and have the same precision as Postgres timestamptz,
-- so both backends hand back identical values.
--
-- STRICT tables make SQLite refuse a value of the wrong type instead of
-- storing it silently. AUTOINCREMENT keeps ids from ever being reused, which
-- event-stream cursors and run paging rely on.

CREATE TABLE accounts (
    id                TEXT    NOT NULL PRIMARY KEY,
    name              TEXT    NOT NULL,
    kind              TEXT    NOT NULL,
    state             TEXT    NOT NULL,
    state_reason      TEXT,
    max_per_minute    INTEGER,
    group_concurrency INTEGER,
    daily_cap         INTEGER,
    created_at        INTEGER NOT NULL
) STRICT;

-- Content-addressed: the bytes live under the data dir, named by sha256.
CREATE TABLE media (
    sha256     TEXT    NOT NULL PRIMARY KEY,
    mime       TEXT    NOT NULL,
    size       INTEGER NOT NULL,
    filename   TEXT,
    created_at INTEGER NOT NULL
) STRICT;

-- A gateway's handle for media uploaded by one account, reused until it expires.
CREATE TABLE media_uploads (
    account_id TEXT    NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    media_id   TEXT    NOT NULL REFERENCES media (sha256) ON DELETE CASCADE,
    handle     TEXT    NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (account_id, media_id)
) STRICT;

-- Deleting an account is refused while it has live reminders; its archived
-- ones (and their run history) go with it.
CREATE TABLE reminders (
    id                 INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    account_id         TEXT    NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    title              TEXT    NOT NULL,
    timezone           TEXT    NOT NULL,
    schedule_kind      TEXT    NOT NULL,
    schedule_expr      TEXT    NOT NULL,
    window_start_hour  INTEGER NOT NULL,
    window_end_hour    INTEGER NOT NULL,
    resume_next_window INTEGER NOT NULL,
    state              TEXT    NOT NULL,
    created_at         INTEGER NOT NULL,
    updated_at         INTEGER NOT NULL
) STRICT;

CREATE INDEX reminders_account ON reminders (account_id);

CREATE TABLE reminder_parts (
    reminder_id INTEGER NOT NULL REFERENCES reminders (id) ON DELETE CASCADE,
    position    INTEGER NOT NULL,
    kind        TEXT    NOT NULL,
    text        TEXT,
    -- No cascade: media a reminder still uses must not disappear under it.
    media_id    TEXT    REFERENCES media (sha256),
    caption     TEXT,
    PRIMARY KEY (reminder_id, position)
) STRICT;

CREATE TABLE reminder_targets (
    reminder_id INTEGER NOT NULL REFERENCES reminders (id) ON DELETE CASCADE,
    position    INTEGER NOT NULL,
    group_jid   TEXT    NOT NULL,
    PRIMARY KEY (reminder_id, position)
) STRICT;

-- account_id records who sent the run; it is history, not a foreign key, so a
-- reminder moved to another account keeps its earlier runs.
CREATE TABLE runs (
    id            INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    reminder_id   INTEGER NOT NULL REFERENCES reminders (id) ON DELETE CASCADE,
    account_id    TEXT    NOT NULL,
    scheduled_for INTEGER NOT NULL,
    window_end_at INTEGER,
    status        TEXT    NOT NULL,
    forecast      TEXT,
    error_summary TEXT,
    created_at    INTEGER NOT NULL,
    started_at    INTEGER,
    finished_at   INTEGER,
    -- The firing lock: one run per occurrence, across restarts and nodes.
    UNIQUE (reminder_id, scheduled_for)
) STRICT;

CREATE INDEX runs_account ON runs (account_id, id);
-- Crash resume reads only the few unfinished runs.
CREATE INDEX runs_unfinished ON runs (id) WHERE status IN ('queued', 'running', 'paused');

CREATE TABLE run_targets (
    id          INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    run_id      INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    position    INTEGER NOT NULL,
    group_jid   TEXT    NOT NULL,
    status      TEXT    NOT NULL,
    parts_sent  INTEGER NOT NULL DEFAULT 0,
    message_id  TEXT,
    attempts    INTEGER NOT NULL DEFAULT 0,
    error       TEXT,
    sent_at     INTEGER,
    latency_ms  INTEGER,
    UNIQUE (run_id, position)
) STRICT;

-- Counts per status and "what is left to send" without scanning the run.
CREATE INDEX run_targets_status ON run_targets (run_id, status);

-- The event log outlives what it talks about: no foreign keys.
CREATE TABLE events (
    id         INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    at         INTEGER NOT NULL,
    kind       TEXT    NOT NULL,
    account_id TEXT,
    run_id     INTEGER,
    data       TEXT    NOT NULL
) STRICT;
