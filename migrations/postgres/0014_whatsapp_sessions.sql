-- WhatsApp sessions, in the database every daemon shares, so a real
-- account can be served by whichever daemon holds its lease
-- (src/gateway/whatsapp/backend.rs maps whatsapp-rust's storage onto it).
--
-- One row per stored item of an account's session: `kind` says what it is
-- (the device, an identity, a Signal session, a pre-key, a sender key,
-- an app-state key, …) and `k` is its key within that kind. `v` is sealed
-- (AES-256-GCM under `whatsapp.session_key_file`, with the account, kind
-- and key as associated data). `g`, a second lookup key, and `n`, a number
-- the store filters or orders by, hold nothing secret.
CREATE TABLE wa_session_rows (
    account_id TEXT    NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    kind       INTEGER NOT NULL,
    k          TEXT    NOT NULL,
    g          TEXT    NOT NULL DEFAULT '',
    n          BIGINT  NOT NULL DEFAULT 0,
    v          BYTEA   NOT NULL,
    PRIMARY KEY (account_id, kind, k)
);
CREATE INDEX wa_session_rows_g ON wa_session_rows (account_id, kind, g);

-- Which member devices of a group hold this account's sender key (sent in
-- a distribution message) and which need one. Not secret; the one part
-- of a session that grows with group size, so it has columns of its own.
CREATE TABLE wa_sender_key_devices (
    account_id TEXT    NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    group_jid  TEXT    NOT NULL,
    device_jid TEXT    NOT NULL,
    has_key    BOOLEAN NOT NULL,
    PRIMARY KEY (account_id, group_jid, device_jid)
);
CREATE INDEX wa_sender_key_devices_device ON wa_sender_key_devices (account_id, device_jid);

-- The key the sessions are sealed under, by its id (the first bytes of
-- its SHA-256, never the key): a daemon whose key file holds another key
-- refuses to start instead of failing every account at its first login.
CREATE TABLE wa_session_key (
    id     INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    key_id TEXT    NOT NULL
);
