-- An account's state changes over time (its page's 30-day chart draws them
-- as bands), read per account without scanning the whole event log. Partial:
-- only `account_state` events pay for it, not every run's progress.
CREATE INDEX events_account_state ON events (account_id, at) WHERE kind = 'account_state';
