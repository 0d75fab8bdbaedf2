-- What WhatsApp last said of an account (its standing): the reach-out
-- time-lock and the new-chat quota, each with when it was read, as JSON
-- (domain::Standing). Kept with the account so a daemon that restarts or
-- takes the account over starts from it. NULL: never read.
ALTER TABLE accounts ADD COLUMN standing TEXT;

-- A change of standing is pushed to subscriptions that ask for it.
INSERT INTO webhook_event_types (type, kind) VALUES
    ('account.standing', 'account_standing');
