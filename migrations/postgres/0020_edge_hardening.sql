-- A console session opened with the daemon's own token (or while the port
-- had none) keeps a mark of that token, derived with the session's id, so
-- a session outlives no token rotation: a daemon started with another
-- token finds the mark does not match and signs the session out. Sessions
-- stored before this column existed have no mark and are refused the same
-- way. Users' sessions need none: revoking the user deletes them.
ALTER TABLE console_sessions ADD COLUMN token_mark TEXT;
-- A write another daemon of the cluster forwarded is audited where it
-- runs, naming the principal it was forwarded for and, here, the daemon
-- that forwarded it.
ALTER TABLE audit_log ADD COLUMN forwarded_by TEXT;
-- Webhook signing secrets are sealed bound to their place (subscription,
-- number, end of overlap: seal::SecretPlace), so a rotated-out secret
-- cannot be made current again by writing the database. Rows sealed
-- before (bound = 0: the subscription id alone) are re-sealed bound at
-- the first start with the key (SqlStore::bind_webhook_secrets).
ALTER TABLE webhook_secrets ADD COLUMN bound BIGINT NOT NULL DEFAULT 0;
