-- Attempts that prove no identity (a wrong token, a failed console
-- sign-in) are audited too, with no role, and counted per client address
-- and minute into one entry (`count`), so a flood cannot fill the disk.
ALTER TABLE audit_log ALTER COLUMN role DROP NOT NULL;
ALTER TABLE audit_log ADD COLUMN count BIGINT NOT NULL DEFAULT 1;
