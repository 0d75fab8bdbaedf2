-- Recalls and edits of sent runs (domain::amend). One open at a time per
-- run, even with several daemons: the partial unique index refuses a
-- second. Its marks, one row per group reached, say where each group
-- stands: written before the wire (`sending`) and after (`done`,
-- `too_old`, `failed`), never left once final, so a group is amended once.
CREATE TABLE run_amendments (
    id           INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    run_id       INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    account_id   TEXT    NOT NULL,
    kind         TEXT    NOT NULL,
    edits        TEXT    NOT NULL,
    requested_at INTEGER NOT NULL,
    window_secs  INTEGER NOT NULL,
    finished_at  INTEGER
) STRICT;
CREATE INDEX run_amendments_run ON run_amendments (run_id);
CREATE UNIQUE INDEX run_amendments_one_open ON run_amendments (run_id) WHERE finished_at IS NULL;

CREATE TABLE amend_marks (
    amendment_id INTEGER NOT NULL REFERENCES run_amendments (id) ON DELETE CASCADE,
    target_id    INTEGER NOT NULL REFERENCES run_targets (id) ON DELETE CASCADE,
    account_id   TEXT    NOT NULL,
    state        TEXT    NOT NULL,
    error        TEXT,
    at           INTEGER NOT NULL,
    PRIMARY KEY (amendment_id, target_id)
) STRICT;
-- The send limiter of an account's new actor reads what it amended in the
-- last minute.
CREATE INDEX amend_marks_account ON amend_marks (account_id, at);
CREATE INDEX amend_marks_target ON amend_marks (target_id);

INSERT INTO webhook_event_types (type, kind) VALUES
    ('run.recall_started', 'run_recall_started'),
    ('run.recall_finished', 'run_recall_finished'),
    ('run.edit_started', 'run_edit_started'),
    ('run.edit_finished', 'run_edit_finished');
