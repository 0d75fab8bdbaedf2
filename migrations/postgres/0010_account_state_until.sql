-- When an account's state ends by itself (a temporary ban, a cool-down),
-- kept with the state, so a daemon that restarts or takes the account over
-- mid-ban knows when to try again instead of waiting for the operator.
ALTER TABLE accounts ADD COLUMN state_until TIMESTAMPTZ;
