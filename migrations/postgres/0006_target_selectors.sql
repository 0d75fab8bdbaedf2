-- Target selectors: a reminder may pick groups from its account's
-- directory (JSON: {"all", "labels", "name", "exclude"}); NULL when it
-- names its groups by JID only.
ALTER TABLE reminders ADD COLUMN target_select TEXT;

-- How each run target was chosen: 'explicit', 'all', 'label:<x>' or
-- 'name:<pattern>'. Resolved once when the run starts, then frozen.
ALTER TABLE run_targets ADD COLUMN chosen_by TEXT NOT NULL DEFAULT 'explicit';

-- 0004 made this INTEGER while every other count is BIGINT and the store
-- reads it as one; PostgreSQL refuses to decode INT4 as i64.
ALTER TABLE accounts ALTER COLUMN hourly_cap TYPE BIGINT;
