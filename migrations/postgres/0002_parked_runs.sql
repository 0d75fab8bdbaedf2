-- A run parked until its next window opening (resume_next_window) has its
-- own status, `parked`, instead of sharing the operator's `paused`. Crash
-- resume and the supervisor's ownership sweep read it with the others.
DROP INDEX runs_unfinished;
CREATE INDEX runs_unfinished ON runs (id) WHERE status IN ('queued', 'running', 'paused', 'parked');
-- Runs parked by earlier versions: `paused` with their window passed and
-- the reminder set to resume at the next opening.
UPDATE runs SET status = 'parked'
WHERE status = 'paused'
  AND window_end_at IS NOT NULL
  AND reminder_id IN (SELECT id FROM reminders WHERE resume_next_window = TRUE);
