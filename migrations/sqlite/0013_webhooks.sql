-- Webhook subscriptions: events pushed to the operator's URLs, signed
-- (Standard Webhooks). `types` is a comma-framed list (",run.started,
-- run.finished,") so a trigger can match a type with instr().
CREATE TABLE webhooks (
    id               INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    url              TEXT    NOT NULL,
    types            TEXT    NOT NULL,
    description      TEXT    NOT NULL,
    enabled          INTEGER NOT NULL,
    disabled_reason  TEXT,
    secret           TEXT    NOT NULL,
    old_secret       TEXT,
    old_secret_until INTEGER,
    failing_since    INTEGER,
    created_at       INTEGER NOT NULL
) STRICT;

-- Which stored event kind each webhook type carries (the same pairs as
-- WEBHOOK_TYPES in the code; a contract test holds them together).
CREATE TABLE webhook_event_types (
    type TEXT NOT NULL PRIMARY KEY,
    kind TEXT NOT NULL
) STRICT;
INSERT INTO webhook_event_types (type, kind) VALUES
    ('run.started', 'run_started'),
    ('run.progress', 'run_progress'),
    ('run.finished', 'run_finished'),
    ('run.missed', 'run_missed'),
    ('account.state_changed', 'account_state'),
    ('reminder.failed_to_fire', 'reminder_failed_to_fire');

-- One row per event per subscription: pending until delivered, or failed
-- once the retries are spent. A claim (claimed_by until claimed_until)
-- keeps two daemons from posting the same delivery at once.
CREATE TABLE webhook_deliveries (
    id              INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    webhook_id      INTEGER NOT NULL,
    event_id        INTEGER NOT NULL,
    event_type      TEXT    NOT NULL,
    status          TEXT    NOT NULL,
    attempts        INTEGER NOT NULL,
    next_attempt_at INTEGER NOT NULL,
    claimed_by      TEXT,
    claimed_until   INTEGER,
    last_attempt_at INTEGER,
    last_status     INTEGER,
    last_error      TEXT,
    created_at      INTEGER NOT NULL
) STRICT;
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (status, next_attempt_at);
CREATE INDEX webhook_deliveries_of ON webhook_deliveries (webhook_id, id);

-- In the event's own transaction: nothing between the event and its
-- deliveries can be lost to a crash.
CREATE TRIGGER events_to_webhooks AFTER INSERT ON events
BEGIN
    INSERT INTO webhook_deliveries (webhook_id, event_id, event_type, status, attempts,
                                    next_attempt_at, created_at)
    SELECT w.id, NEW.id, m.type, 'pending', 0, NEW.at, NEW.at
    FROM webhooks w JOIN webhook_event_types m ON m.kind = NEW.kind
    WHERE w.enabled = 1 AND instr(w.types, ',' || m.type || ',') > 0;
END;
