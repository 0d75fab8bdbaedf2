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

-- A receipt names its group and the message's id as it went on the wire
-- (Herald's id cut to 22 characters, gateway::whatsapp::ids): found among
-- the group's targets, a few per group (one per run that sent to it). Not
-- an index on the message id: the engine rewrites that column at every
-- part, and keeping an index of it cost SQLite 30 % of its send rate.
CREATE INDEX run_targets_group ON run_targets (group_jid);

-- When a run's receipts were reported (the `run_receipts` event, once,
-- receipts.settle_after_secs after it ended). Runs that ended before this
-- version are taken as reported: no burst of summaries for history.
ALTER TABLE runs ADD COLUMN receipts_reported_at INTEGER;
UPDATE runs SET receipts_reported_at = finished_at WHERE finished_at IS NOT NULL;
CREATE INDEX runs_receipts_unreported ON runs (finished_at) WHERE receipts_reported_at IS NULL;

-- Webhook subscribers may ask for it as `run.receipts`.
INSERT INTO webhook_event_types (type, kind) VALUES ('run.receipts', 'run_receipts');
