-- A daemon rewrites every lease row it holds and its node row every
-- lease_secs/3. With full pages each rewrite is a new row version on
-- another page and a new entry in both of the table's indexes (about
-- 3.4 WAL records and 280 bytes of WAL a renewal, measured with
-- `herald bench leases`); with room left on each page the new version
-- stays on its page and the indexes are not touched (a HOT update).
-- Rows written from now on get the room; `VACUUM FULL account_leases`
-- gives it to rows already there.
ALTER TABLE account_leases SET (fillfactor = 50);
ALTER TABLE nodes SET (fillfactor = 50);
