-- Herald schema, PostgreSQL dialect (twin of migrations/sqlite/0001_schema.sql).
-- Instants are timestamptz (UTC, microseconds). Integers are BIGINT so both
-- backends decode them as i64.

CREATE TABLE accounts (
    id                TEXT        NOT NULL PRIMARY KEY,
    name              TEXT        NOT NULL,
    kind              TEXT        NOT NULL,
    state             TEXT        NOT NULL,
    state_reason      TEXT,
    max_per_minute    BIGINT,
    group_concurrency BIGINT,
    daily_cap         BIGINT,
    created_at        TIMESTAMPTZ NOT NULL
);

-- Content-addressed: the bytes live under the data dir, named by sha256.
CREATE TABLE media (
    sha256     TEXT        NOT NULL PRIMARY KEY,
    mime       TEXT        NOT NULL,
    size       BIGINT      NOT NULL,
    filename   TEXT,
    created_at TIMESTAMPTZ NOT NULL
);

-- A gateway's handle for media uploaded by one account, reused until it expires.
CREATE TABLE media_uploads (
    account_id TEXT        NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    media_id   TEXT        NOT NULL REFERENCES media (sha256) ON DELETE CASCADE,
    handle     TEXT        NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (account_id, media_id)
);

-- Deleting an account is refused while it has live reminders; its archived
-- ones (and their run history) go with it.
CREATE TABLE reminders (
    id                 BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id         TEXT        NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    title              TEXT        NOT NULL,
    timezone           TEXT        NOT NULL,
    schedule_kind      TEXT        NOT NULL,
    schedule_expr      TEXT        NOT NULL,
    window_start_hour  BIGINT      NOT NULL,
    window_end_hour    BIGINT      NOT NULL,
    resume_next_window BOOLEAN     NOT NULL,
    state              TEXT        NOT NULL,
    created_at         TIMESTAMPTZ NOT NULL,
    updated_at         TIMESTAMPTZ NOT NULL
);

CREATE INDEX reminders_account ON reminders (account_id);

CREATE TABLE reminder_parts (
    reminder_id BIGINT NOT NULL REFERENCES reminders (id) ON DELETE CASCADE,
    position    BIGINT NOT NULL,
    kind        TEXT   NOT NULL,
    text        TEXT,
    -- No cascade: media a reminder still uses must not disappear under it.
    media_id    TEXT   REFERENCES media (sha256),
    caption     TEXT,
    PRIMARY KEY (reminder_id, position)
);

CREATE TABLE reminder_targets (
    reminder_id BIGINT NOT NULL REFERENCES reminders (id) ON DELETE CASCADE,
    position    BIGINT NOT NULL,
    group_jid   TEXT   NOT NULL,
    PRIMARY KEY (reminder_id, position)
);

-- account_id records who sent the run; it is history, not a foreign key, so a
-- reminder moved to another account keeps its earlier runs.
CREATE TABLE runs (
    id            BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    reminder_id   BIGINT      NOT NULL REFERENCES reminders (id) ON DELETE CASCADE,
    account_id    TEXT        NOT NULL,
    scheduled_for TIMESTAMPTZ NOT NULL,
    window_end_at TIMESTAMPTZ,
    status        TEXT        NOT NULL,
    forecast      TEXT,
    error_summary TEXT,
    created_at    TIMESTAMPTZ NOT NULL,
    started_at    TIMESTAMPTZ,
    finished_at   TIMESTAMPTZ,
    -- The firing lock: one run per occurrence, across restarts and nodes.
    UNIQUE (reminder_id, scheduled_for)
);

CREATE INDEX runs_account ON runs (account_id, id);
-- Crash resume reads only the few unfinished runs.
CREATE INDEX runs_unfinished ON runs (id) WHERE status IN ('queued', 'running', 'paused');

CREATE TABLE run_targets (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id      BIGINT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    position    BIGINT NOT NULL,
    group_jid   TEXT   NOT NULL,
    status      TEXT   NOT NULL,
    parts_sent  BIGINT NOT NULL DEFAULT 0,
    message_id  TEXT,
    attempts    BIGINT NOT NULL DEFAULT 0,
    error       TEXT,
    sent_at     TIMESTAMPTZ,
    latency_ms  BIGINT,
    UNIQUE (run_id, position)
);

-- Counts per status and "what is left to send" without scanning the run.
CREATE INDEX run_targets_status ON run_targets (run_id, status);

-- The event log outlives what it talks about: no foreign keys.
CREATE TABLE events (
    id         BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         TIMESTAMPTZ NOT NULL,
    kind       TEXT        NOT NULL,
    account_id TEXT,
    run_id     BIGINT,
    data       TEXT        NOT NULL
);
