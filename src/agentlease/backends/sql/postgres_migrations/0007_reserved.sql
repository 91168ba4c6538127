-- Placeholder for schema version 7 (retry budgets and circuit breakers, 0007_budgets.sql, which
-- lands on its own branch): versions are numbered without gaps. Delete this file when that one
-- is merged.
SELECT 1;
