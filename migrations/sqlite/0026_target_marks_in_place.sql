-- Every message marks its target twice (sending, then sent), and each mark
-- moved the target's entry in the status index. Nothing needs that index
-- any more: every query of targets names its run, and (run_id, position)
-- finds a run's targets, in order. Counts per run now read the run's
-- target rows instead of the index. (PostgreSQL's 0026 also leaves room
-- on each page for marks made in place; SQLite has no fill factor.)
DROP INDEX run_targets_status;
