-- When each group's first reader was counted: a run's page draws groups
-- read over time from it, as it draws groups reached from first_at. Groups
-- counted before this column keep their read counts, but draw no curve.
ALTER TABLE run_receipts ADD COLUMN first_read_at TIMESTAMPTZ;
