-- Webhook subscriptions: events pushed to the operator's URLs, signed
-- (Standard Webhooks). `types` is a comma-framed list (",run.started,
-- run.finished,") so a trigger can match a type with strpos().
CREATE TABLE webhooks (
    id               BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    url              TEXT        NOT NULL,
    types            TEXT        NOT NULL,
    description      TEXT        NOT NULL,
    enabled          BOOLEAN     NOT NULL,
    disabled_reason  TEXT,
    secret           TEXT        NOT NULL,
    old_secret       TEXT,
    old_secret_until TIMESTAMPTZ,
    failing_since    TIMESTAMPTZ,
    created_at       TIMESTAMPTZ NOT NULL
);

-- Which stored event kind each webhook type carries (the same pairs as
-- WEBHOOK_TYPES in the code; a contract test holds them together).
CREATE TABLE webhook_event_types (
    type TEXT NOT NULL PRIMARY KEY,
    kind TEXT NOT NULL
);
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
    id              BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    webhook_id      BIGINT      NOT NULL,
    event_id        BIGINT      NOT NULL,
    event_type      TEXT        NOT NULL,
    status          TEXT        NOT NULL,
    attempts        BIGINT      NOT NULL,
    next_attempt_at TIMESTAMPTZ NOT NULL,
    claimed_by      TEXT,
    claimed_until   TIMESTAMPTZ,
    last_attempt_at TIMESTAMPTZ,
    last_status     BIGINT,
    last_error      TEXT,
    created_at      TIMESTAMPTZ NOT NULL
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (status, next_attempt_at);
CREATE INDEX webhook_deliveries_of ON webhook_deliveries (webhook_id, id);

-- In the event's own transaction: nothing between the event and its
-- deliveries can be lost to a crash.
CREATE FUNCTION events_to_webhooks() RETURNS trigger AS $$
BEGIN
    INSERT INTO webhook_deliveries (webhook_id, event_id, event_type, status, attempts,
                                    next_attempt_at, created_at)
    SELECT w.id, NEW.id, m.type, 'pending', 0, NEW.at, NEW.at
    FROM webhooks w JOIN webhook_event_types m ON m.kind = NEW.kind
    WHERE w.enabled AND strpos(w.types, ',' || m.type || ',') > 0;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER events_to_webhooks AFTER INSERT ON events
    FOR EACH ROW EXECUTE FUNCTION events_to_webhooks();
