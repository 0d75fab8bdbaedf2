-- An operator's stop of a run that is sending is written before it is
-- answered, so a crash before the run ends cannot resume it: the run
-- restarts, sees the request and ends cancelled without sending.
ALTER TABLE runs ADD COLUMN stop_requested_at INTEGER;
