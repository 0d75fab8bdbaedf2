-- Every message marks its target twice (sending, then sent). With an
-- index on the status each mark was a new row version on another page and
-- a new entry in all four of the table's indexes: about 11 WAL records and
-- 1.1 KB of WAL a message for the marks alone, measured on a copy of the
-- table. Nothing needs the status index any more: every query of targets
-- names its run, and (run_id, position) finds a run's targets, in order.
-- Without it, and with room left on each page, a mark is a HOT update in
-- place (about 2 WAL records, 360 bytes a message). The price is space:
-- pages are written 30 % full and fill as their targets are marked.
-- Targets written from now on get the room; those already stored keep
-- their full pages (their runs are mostly over).
-- Counts per run now read the run's target rows instead of the index.
DROP INDEX run_targets_status;
ALTER TABLE run_targets SET (fillfactor = 30);
