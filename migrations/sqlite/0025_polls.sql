-- Polls (a reminder part of kind 'poll'): its question is kept in `text`,
-- its options and whether several may be chosen in `poll`, a JSON object
-- {"options": [...], "multiple": false}.
ALTER TABLE reminder_parts ADD COLUMN poll TEXT;

-- A run's polls as they were sent: votes are read against the options the
-- members saw, whatever happens to the reminder afterwards.
CREATE TABLE run_polls (
    run_id   INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    part     INTEGER NOT NULL,
    question TEXT    NOT NULL,
    options  TEXT    NOT NULL,
    multiple INTEGER NOT NULL,
    PRIMARY KEY (run_id, part)
) STRICT;

-- Each group's copy of a poll, by the message id a vote names (Herald's id
-- cut to 22 characters, as receipts carry it): written once when the run
-- starts, never rewritten, so an index of it costs the send path nothing.
CREATE TABLE poll_messages (
    poll_key  TEXT    NOT NULL PRIMARY KEY,
    target_id INTEGER NOT NULL REFERENCES run_targets (id) ON DELETE CASCADE,
    part      INTEGER NOT NULL
) STRICT;
CREATE INDEX poll_messages_target ON poll_messages (target_id);

-- Each voter's current choice per group and poll: a bit per option
-- (0: withdrawn) and when it was cast (the latest wins). The voter is a
-- token keyed by the target (domain::voter_token), not a phone number.
CREATE TABLE poll_votes (
    target_id INTEGER NOT NULL REFERENCES run_targets (id) ON DELETE CASCADE,
    part      INTEGER NOT NULL,
    run_id    INTEGER NOT NULL,
    voter     TEXT    NOT NULL,
    choices   INTEGER NOT NULL,
    voted_at  INTEGER NOT NULL,
    PRIMARY KEY (target_id, part, voter)
) STRICT;
CREATE INDEX poll_votes_run ON poll_votes (run_id, part);

-- A run's polls' answers, reported with its receipts once they settle;
-- webhook subscribers may ask for it as `run.poll`.
INSERT INTO webhook_event_types (type, kind) VALUES ('run.poll', 'run_poll');
