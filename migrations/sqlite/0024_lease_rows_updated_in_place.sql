-- PostgreSQL's migration 0024 leaves room on lease pages for rows renewed
-- in place. SQLite has no fill factor (and serves one daemon): nothing to
-- change, the numbering kept in step.
SELECT 1;
