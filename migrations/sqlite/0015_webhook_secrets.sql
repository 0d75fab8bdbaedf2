-- Webhook signing secrets, sealed at rest like the WhatsApp sessions
-- (AES-256-GCM under `whatsapp.session_key_file`, whose id `wa_session_key`
-- records, with the subscription id as associated data; src/seal): the
-- current secret (`valid_until` NULL) and the previous ones, each of which goes
-- on signing until its own `valid_until` (a rotation's overlap; a second
-- rotation inside an overlap does not cut the first one's short). `n`
-- counts a subscription's secrets in the order they were made.
CREATE TABLE webhook_secrets (
    webhook_id  INTEGER NOT NULL,
    n           INTEGER NOT NULL,
    sealed      BLOB    NOT NULL,
    valid_until INTEGER,
    PRIMARY KEY (webhook_id, n)
) STRICT;

-- `webhooks.secret`, `old_secret` and `old_secret_until` held the secrets
-- in plain text before this migration. A migration has no key, so the
-- first start with the key seals them into `webhook_secrets` and empties
-- those columns in one transaction (SqlStore::seal_plaintext_webhook_
-- secrets); new subscriptions leave `secret` empty.
