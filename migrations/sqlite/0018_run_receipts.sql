-- Receipts counted per run target: distinct participants who received and
-- who read each group's message. A row per target that got a receipt,
-- bounded by the group's participants, never by the receipts: the
-- `*_by` columns hold one 16-hex-digit token per participant counted
-- (domain::receipts::SeenSet), so a receipt heard again, after a restart
-- or by the account's next owner, counts once.
CREATE TABLE run_receipts (
    target_id       INTEGER NOT NULL PRIMARY KEY REFERENCES run_targets (id) ON DELETE CASCADE,
    run_id          INTEGER NOT NULL,
    delivered_count INTEGER NOT NULL,
    read_count      INTEGER NOT NULL,
    first_at        INTEGER,
    last_at         INTEGER,
    delivered_by    TEXT    NOT NULL,
    read_by         TEXT    NOT NULL
) STRICT;
CREATE INDEX run_receipts_run ON run_receipts (run_id);

-- A receipt names a message by its id as it went on the wire, Herald's id
-- cut to 22 characters (gateway::whatsapp::ids).
CREATE INDEX run_targets_receipt_key ON run_targets (substr(message_id, 1, 22))
    WHERE message_id IS NOT NULL;

-- When a run's receipts were reported (the `run_receipts` event, once,
-- receipts.settle_after_secs after it ended). Runs that ended before this
-- version are taken as reported: no burst of summaries for history.
ALTER TABLE runs ADD COLUMN receipts_reported_at INTEGER;
UPDATE runs SET receipts_reported_at = finished_at WHERE finished_at IS NOT NULL;
CREATE INDEX runs_receipts_unreported ON runs (finished_at) WHERE receipts_reported_at IS NULL;

-- Webhook subscribers may ask for it as `run.receipts`.
INSERT INTO webhook_event_types (type, kind) VALUES ('run.receipts', 'run_receipts');
