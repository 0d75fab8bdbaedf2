-- The group directory: what each paired account reported it is in at its
-- last sync, with operators' labels. A group the account left stays with
-- member = false (its labels are kept in case it comes back).
CREATE TABLE account_groups (
    account_id   TEXT        NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    jid          TEXT        NOT NULL,
    subject      TEXT        NOT NULL,
    -- Lower-cased subject: name search is a case-insensitive substring.
    subject_fold TEXT        NOT NULL,
    participants BIGINT      NOT NULL,
    announce     BOOLEAN     NOT NULL,
    is_admin     BOOLEAN     NOT NULL,
    can_post     BOOLEAN     NOT NULL,
    community    TEXT,
    member       BOOLEAN     NOT NULL,
    synced_at    TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (account_id, jid)
);

CREATE TABLE group_labels (
    account_id TEXT NOT NULL,
    jid        TEXT NOT NULL,
    label      TEXT NOT NULL,
    PRIMARY KEY (account_id, jid, label),
    FOREIGN KEY (account_id, jid) REFERENCES account_groups (account_id, jid) ON DELETE CASCADE
);
CREATE INDEX group_labels_by_label ON group_labels (account_id, label, jid);

CREATE TABLE group_syncs (
    account_id TEXT        NOT NULL PRIMARY KEY REFERENCES accounts (id) ON DELETE CASCADE,
    synced_at  TIMESTAMPTZ NOT NULL
);
