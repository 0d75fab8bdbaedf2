-- A reminder may ask that no two groups of a run receive byte-identical
-- text (its templates' alternatives give each group its own variant).
ALTER TABLE reminders ADD COLUMN unique_texts BOOLEAN NOT NULL DEFAULT FALSE;

-- Ban-safety: an hourly cap and a timezone for an account's days and
-- hours (the daily cap is enforced from now on), and the time of its last
-- account-level signal, which restarts its warm-up ramp.
-- BIGINT like the other limits: the store reads them all as 64-bit.
ALTER TABLE accounts ADD COLUMN hourly_cap BIGINT;
ALTER TABLE accounts ADD COLUMN timezone TEXT;
ALTER TABLE accounts ADD COLUMN incident_at TIMESTAMPTZ;
