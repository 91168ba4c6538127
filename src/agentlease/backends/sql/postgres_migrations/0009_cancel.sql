-- agentlease on PostgreSQL, schema version 9: cancelling tasks and deleting queues.
--
-- Applied like 0001_initial.sql: in one transaction under the schema's advisory lock, with
-- search_path set to that schema.
--
-- A task gains cancel_reason (NULL for every task made before this version: adding a nullable
-- column without a default only changes the catalog) and a new terminal state, 'cancelled'.
-- agentlease_cancel decides a cancel in one call: a waiting task (queued, scheduled, failed,
-- parked), or a lease that ran out, becomes cancelled at once; a live lease keeps its state and
-- token and gets cancel_reason set (with the cancel error in error). Every holder write requires
-- cancel_reason IS NULL (the statements of postgres.sql, and agentlease_complete_many below), so
-- the holder's writes are refused; agentlease_extend renews no such lease and ends its task
-- cancelled in the same call, and agentlease_reap ends an expired one cancelled instead of
-- requeueing it. The partition trigger now also fires when a task becomes cancelled, so a
-- cancel frees its partition exactly as a completion does.
--
-- Rolling upgrade: clients of version 8 call the same functions. Those replaced here keep their
-- signatures; a client of version 8 never cancels, so cancel_reason stays NULL for it and every
-- function behaves as before. Its stats read no 'cancelled' count (a version 8 client does not
-- know the state).
--
-- agentlease_delete_queue deletes one bounded batch of a queue's tasks per call, through the
-- partial indexes by state (never a scan of other queues' tasks), and the queue itself with the
-- last batch.

ALTER TABLE agentlease_tasks
    ADD COLUMN cancel_reason text,
    DROP CONSTRAINT agentlease_tasks_state,
    ADD CONSTRAINT agentlease_tasks_state CHECK (
        state IN ('parked', 'scheduled', 'queued', 'leased', 'failed', 'done', 'dead',
                  'cancelled')
    );

CREATE INDEX agentlease_tasks_cancelled ON agentlease_tasks (queue, finished_at)
    WHERE state = 'cancelled';

DROP TRIGGER agentlease_tasks_partition_freed ON agentlease_tasks;
CREATE TRIGGER agentlease_tasks_partition_freed
AFTER UPDATE OF state ON agentlease_tasks
FOR EACH ROW
WHEN (
    NEW.partition IS NOT NULL AND NEW.state IN ('done', 'dead', 'cancelled')
    AND OLD.state NOT IN ('done', 'dead', 'cancelled')
)
EXECUTE FUNCTION agentlease_partition_freed();

-- Cancel one task (see the header). Returns no row for an unknown task, else the outcome
-- ('cancelled', 'requested' or 'finished'), the state after the call and the error the task
-- keeps (a reason asked for earlier keeps its own).
CREATE FUNCTION agentlease_cancel(p_id text, p_reason text, p_error json)
RETURNS TABLE (outcome text, state text, error json)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz;
    v_state  text;
    v_live   boolean;
    v_queue  text;
    v_part   text;
BEGIN
    -- The partition first, then the row, as enqueue and unpark take them: a cancel of a parked
    -- task that an unpark is starting waits for it instead of deadlocking with it.
    SELECT t.queue, t.partition INTO v_queue, v_part FROM agentlease_tasks t WHERE t.id = p_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_part IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(agentlease_partition_key(v_queue, v_part));
    END IF;
    SELECT t.state INTO v_state FROM agentlease_tasks t WHERE t.id = p_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_state IN ('done', 'dead', 'cancelled') THEN
        RETURN QUERY SELECT 'finished'::text, t.state, t.error FROM agentlease_tasks t
                     WHERE t.id = p_id;
        RETURN;
    END IF;
    v_now := clock_timestamp();
    SELECT t.state = 'leased' AND t.expires_at > v_now INTO v_live
    FROM agentlease_tasks t WHERE t.id = p_id;
    IF v_live THEN
        RETURN QUERY
        UPDATE agentlease_tasks t
        SET cancel_reason = coalesce(t.cancel_reason, p_reason),
            error = CASE WHEN t.cancel_reason IS NULL THEN p_error ELSE t.error END
        WHERE t.id = p_id
        RETURNING 'requested'::text, t.state, t.error;
        RETURN;
    END IF;
    RETURN QUERY
    UPDATE agentlease_tasks t
    SET state = 'cancelled', token = NULL, expires_at = NULL, finished_at = v_now,
        cancel_reason = coalesce(t.cancel_reason, p_reason),
        error = CASE WHEN t.cancel_reason IS NULL THEN p_error ELSE t.error END
    WHERE t.id = p_id
    RETURNING 'cancelled'::text, t.state, t.error;
END
$$;

-- agentlease_extend of 0001_initial.sql, except that a lease whose task a cancel was asked for
-- is not renewed: held under that token, its task ends cancelled in this same call.
CREATE OR REPLACE FUNCTION agentlease_extend(
    p_ids text[], p_tokens text[], p_lease_for double precision
)
RETURNS TABLE (task_id text, token text, expires_at double precision)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := clock_timestamp();
    v_tokens jsonb;
BEGIN
    SELECT jsonb_object_agg(g.id, g.tokens) INTO v_tokens
    FROM (
        SELECT l.id, jsonb_agg(l.token) AS tokens
        FROM unnest(p_ids, p_tokens) AS l(id, token)
        GROUP BY l.id
    ) g;

    UPDATE agentlease_tasks t
    SET state = 'cancelled', token = NULL, expires_at = NULL, finished_at = v_now
    WHERE t.id = ANY (p_ids) AND (v_tokens -> t.id) ? t.token AND t.cancel_reason IS NOT NULL;

    RETURN QUERY
    UPDATE agentlease_tasks t
    SET expires_at = least(
        v_now + make_interval(secs => p_lease_for), t.lease_deadline,
        t.progressed_at + t.progress_timeout
    )
    WHERE t.id = ANY (p_ids) AND (v_tokens -> t.id) ? t.token AND t.expires_at > v_now
      AND t.cancel_reason IS NULL
    RETURNING t.id, t.token, extract(epoch FROM t.expires_at)::float8;
END
$$;

-- agentlease_complete_many of 0004_partitions.sql, refusing a lease whose task a cancel was
-- asked for.
CREATE OR REPLACE FUNCTION agentlease_complete_many(
    p_ids text[], p_tokens text[], p_results text[]
)
RETURNS TABLE (task_id text, token text)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_queues text[];
    v_parts  text[];
BEGIN
    SELECT array_agg(l.queue), array_agg(l.partition) INTO v_queues, v_parts
    FROM (
        SELECT t.queue, t.partition FROM agentlease_tasks t
        WHERE t.id = ANY (p_ids) AND t.token = ANY (p_tokens) AND t.partition IS NOT NULL
        ORDER BY t.id
        FOR NO KEY UPDATE
    ) l;
    IF v_parts IS NOT NULL THEN
        PERFORM agentlease_lock_partitions(v_queues, v_parts);
    END IF;

    RETURN QUERY
    UPDATE agentlease_tasks AS t
    SET state = 'done', result = d.result::json, finished_at = clock_timestamp(), token = NULL,
        expires_at = NULL
    FROM unnest(p_ids, p_tokens, p_results) AS d(id, token, result)
    WHERE t.id = d.id AND t.token = d.token AND t.expires_at > clock_timestamp()
      AND t.cancel_reason IS NULL
    RETURNING d.id, d.token;
END
$$;

-- agentlease_reap of 0004_partitions.sql, except that an expired lease whose task a cancel was
-- asked for ends cancelled (outcome 'cancelled'), never requeued nor counted as a reclaim.
CREATE OR REPLACE FUNCTION agentlease_reap(p_queue text, p_front boolean, p_now timestamptz)
RETURNS TABLE (task_id text, attempt integer, outcome text)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_ids    text[];
    v_queues text[];
    v_parts  text[];
BEGIN
    SELECT array_agg(e.id),
           array_agg(e.queue) FILTER (WHERE e.ends AND e.partition IS NOT NULL),
           array_agg(e.partition) FILTER (WHERE e.ends AND e.partition IS NOT NULL)
    INTO v_ids, v_queues, v_parts
    FROM (
        SELECT x.id, x.queue, x.partition,
               x.reclaims + 1 > x.max_reclaims OR x.cancel_reason IS NOT NULL AS ends
        FROM agentlease_tasks x
        WHERE x.queue = p_queue AND x.state = 'leased' AND x.expires_at <= p_now
        ORDER BY x.expires_at, x.id
        FOR UPDATE SKIP LOCKED
    ) e;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    IF v_parts IS NOT NULL THEN
        PERFORM agentlease_lock_partitions(v_queues, v_parts);
    END IF;

    RETURN QUERY
    WITH reaped AS (
        UPDATE agentlease_tasks t
        SET state = CASE
                WHEN t.cancel_reason IS NOT NULL THEN 'cancelled'
                WHEN t.reclaims + 1 > t.max_reclaims THEN 'dead'
                ELSE 'queued'
            END,
            reclaims = CASE WHEN t.cancel_reason IS NOT NULL THEN t.reclaims
                            ELSE t.reclaims + 1 END,
            token = NULL,
            expires_at = NULL,
            finished_at = CASE
                WHEN t.cancel_reason IS NOT NULL OR t.reclaims + 1 > t.max_reclaims THEN p_now
                ELSE t.finished_at
            END,
            error = CASE
                WHEN t.cancel_reason IS NOT NULL THEN t.error
                WHEN t.reclaims + 1 > t.max_reclaims THEN format(
                    '{"type":"LeaseExpired","message":"lease expired %s times"}', t.reclaims + 1
                )::json
                ELSE t.error
            END,
            seq = CASE
                WHEN t.cancel_reason IS NOT NULL OR t.reclaims + 1 > t.max_reclaims THEN t.seq
                WHEN p_front THEN agentlease_front(t.seq)
                ELSE nextval('agentlease_seq')
            END
        WHERE t.id = ANY (v_ids)
        RETURNING t.id, t.attempt, t.state
    )
    SELECT r.id, r.attempt,
           CASE WHEN r.state = 'queued' THEN 'requeued' ELSE r.state END
    FROM reaped r;
END
$$;

-- Delete up to p_limit tasks of p_queue (any state), read through the partial index of each
-- state, and the queue itself once none is left. Unless p_force, a queue with a live lease is
-- refused: deleted 0, gone false and the number of live leases.
CREATE FUNCTION agentlease_delete_queue(p_queue text, p_limit integer, p_force boolean)
RETURNS TABLE (deleted integer, gone boolean, leased integer)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_leased  integer;
    v_deleted integer;
BEGIN
    IF NOT p_force THEN
        SELECT count(*) INTO v_leased FROM agentlease_tasks x
        WHERE x.queue = p_queue AND x.state = 'leased' AND x.expires_at > clock_timestamp();
        IF v_leased > 0 THEN
            RETURN QUERY SELECT 0, false, v_leased;
            RETURN;
        END IF;
    END IF;
    WITH picked AS (
        (SELECT x.id FROM agentlease_tasks x
         WHERE x.queue = p_queue AND x.state = 'done' LIMIT p_limit)
        UNION ALL
        (SELECT x.id FROM agentlease_tasks x
         WHERE x.queue = p_queue AND x.state = 'dead' LIMIT p_limit)
        UNION ALL
        (SELECT x.id FROM agentlease_tasks x
         WHERE x.queue = p_queue AND x.state = 'cancelled' LIMIT p_limit)
        UNION ALL
        (SELECT x.id FROM agentlease_tasks x
         WHERE x.queue = p_queue AND x.state = 'queued' LIMIT p_limit)
        UNION ALL
        (SELECT x.id FROM agentlease_tasks x
         WHERE x.queue = p_queue AND x.state IN ('scheduled', 'failed') LIMIT p_limit)
        UNION ALL
        (SELECT x.id FROM agentlease_tasks x
         WHERE x.queue = p_queue AND x.state = 'leased' LIMIT p_limit)
        UNION ALL
        (SELECT x.id FROM agentlease_tasks x
         WHERE x.queue = p_queue AND x.state = 'parked' LIMIT p_limit)
    ), deleted AS (
        DELETE FROM agentlease_tasks t
        WHERE t.id IN (SELECT p.id FROM picked p LIMIT p_limit)
        RETURNING 1
    )
    SELECT count(*) INTO v_deleted FROM deleted;
    IF v_deleted < p_limit THEN
        DELETE FROM agentlease_queues q WHERE q.name = p_queue;
        RETURN QUERY SELECT v_deleted, true, 0;
        RETURN;
    END IF;
    RETURN QUERY SELECT v_deleted, false, 0;
END
$$;
