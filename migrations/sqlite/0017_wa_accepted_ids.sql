-- Message ids WhatsApp accepted from an account (its server ack), shared by
-- every daemon that owns the account in turn: a resend of one of them,
-- by this owner or the next after a takeover, is answered "duplicate"
-- without a second stanza. Kept as long as runs are (retention.runs_days).
-- Replaces the per-daemon file <data_dir>/whatsapp/<account>/acked-ids,
-- imported once at the account's next login.
CREATE TABLE wa_accepted_ids (
    account_id  TEXT    NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    message_id  TEXT    NOT NULL,
    accepted_at INTEGER NOT NULL,
    PRIMARY KEY (account_id, message_id)
) STRICT;
CREATE INDEX wa_accepted_ids_at ON wa_accepted_ids (accepted_at);
