-- Retention: expired retry budgets and circuit breakers are deleted on the workers' timer
-- (state_purge in postgres.sql) through these, oldest expiry first, visiting only the rows
-- deleted. Done, dead and cancelled tasks already have their partial indexes on
-- (queue, finished_at): agentlease_tasks_done and agentlease_tasks_dead (0001_initial.sql),
-- agentlease_tasks_cancelled (0009_cancel.sql).

CREATE INDEX agentlease_budgets_expiry ON agentlease_budgets (expires_at);
CREATE INDEX agentlease_breakers_expiry ON agentlease_breakers (expires_at);
