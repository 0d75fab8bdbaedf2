-- Warm-up applies to accounts whose number is new to WhatsApp automation:
-- Herald knows when an account was added here, not how old its number is,
-- so the operator says so when adding it.
ALTER TABLE accounts ADD COLUMN new_number BOOLEAN NOT NULL DEFAULT FALSE;
