-- Large installs: reads proportional to what changed, and retention.
--
-- Every write of a reminder sets `version` to one more than the highest in
-- the table, inside the writing transaction. SQLite has one writer, so
-- versions follow commit order and the scheduler's reconcile can read just
-- the reminders written since the highest version it has seen.
ALTER TABLE reminders ADD COLUMN version INTEGER NOT NULL DEFAULT 0;
UPDATE reminders SET version = id;
CREATE INDEX reminders_version ON reminders (version);
-- A reminder's parts and targets, counted when it is written: a page of
-- the reminder list reads no child rows.
ALTER TABLE reminders ADD COLUMN part_count INTEGER NOT NULL DEFAULT 0;
ALTER TABLE reminders ADD COLUMN target_count INTEGER NOT NULL DEFAULT 0;
UPDATE reminders SET
    part_count = (SELECT COUNT(*) FROM reminder_parts p WHERE p.reminder_id = reminders.id),
    target_count = (SELECT COUNT(*) FROM reminder_targets t WHERE t.reminder_id = reminders.id);
-- The scheduler's full pass (active reminders) and filtered lists.
CREATE INDEX reminders_state ON reminders (state, id);

-- The scheduler's periodic read of `scheduled` runs, and run lists by status.
CREATE INDEX runs_status ON runs (status, id);
-- Retention: finished runs by when they ended (missed runs never started).
CREATE INDEX runs_ended ON runs (COALESCE(finished_at, created_at));
-- Retention: events by age.
CREATE INDEX events_at ON events (at);
-- Retention: media that no reminder uses (the foreign key from parts).
CREATE INDEX reminder_parts_media ON reminder_parts (media_id) WHERE media_id IS NOT NULL;
CREATE INDEX media_created ON media (created_at);

-- What retention has deleted, so the event stream can tell a client whose
-- position is gone.
CREATE TABLE retention_marks (
    what    TEXT    NOT NULL PRIMARY KEY,
    through INTEGER NOT NULL
) STRICT;
