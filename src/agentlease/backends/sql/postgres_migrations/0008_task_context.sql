-- agentlease on PostgreSQL, schema version 8: a task's context, the root task and deadline it
-- inherits from the handler that enqueued it.
--
-- Applied like 0001_initial.sql: in one transaction under the schema's advisory lock, with
-- search_path set to that schema.
--
-- The context is a JSON object ({"root": <task id>, "deadline": <epoch seconds on the store's
-- clock>}, either key optional) kept byte for byte as the client encoded it, NULL for a task
-- without one (and for every task made before this version). It belongs to the task: nothing but
-- enqueue writes it, so it survives retries, reclaims and requeues from the dead letters as they
-- are. Adding a nullable column without a default only changes the catalog: the table is not
-- rewritten, however many tasks it holds.
--
-- Two functions gain the column under new names, so that clients of schema version 7 still
-- running (a rolling upgrade) keep calling the old ones, which stay as they were and leave the
-- column NULL:
-- 1. agentlease_enqueue_context: agentlease_enqueue (0004_partitions.sql) with one more aligned
--    array, the tasks' contexts.
-- 2. agentlease_claim_context: agentlease_claim_ranked (0006_leaner_calls.sql) that also returns
--    each job's context, read from the row it leases (no second lookup).

ALTER TABLE agentlease_tasks ADD COLUMN context json;

-- Enqueue a batch with partitions, as agentlease_enqueue does, storing each task's context.
CREATE FUNCTION agentlease_enqueue_context(
    p_ids text[],
    p_queues text[],
    p_priorities integer[],
    p_payloads json[],
    p_dedup_keys text[],
    p_max_reclaims integer[],
    p_delays double precision[],
    p_partitions text[],
    p_queue_names text[],
    p_channels text[],
    p_contexts json[]
)
RETURNS TABLE (ids text[], queues text[], dedup_keys text[])
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz;
    v_ids    text[];
    v_queues text[];
    v_keys   text[];
    v_parts  text[];
BEGIN
    INSERT INTO agentlease_queues (name, channel)
    SELECT n.name, n.channel FROM unnest(p_queue_names, p_channels) AS n(name, channel)
    ON CONFLICT DO NOTHING;

    UPDATE agentlease_queues q SET channel = n.channel
    FROM unnest(p_queue_names, p_channels) AS n(name, channel)
    WHERE q.name = n.name AND q.channel IS NULL;
    PERFORM agentlease_lock_partitions(p_queues, p_partitions);

    v_now := clock_timestamp();
    WITH created AS (
        INSERT INTO agentlease_tasks
            (id, queue, state, priority, seq, payload, dedup_key, max_reclaims, created_at,
             run_at, partition, context)
        SELECT i.id, i.queue,
               CASE WHEN i.part IS NOT NULL THEN 'parked'
                    WHEN i.delay > 0 THEN 'scheduled'
                    ELSE 'queued' END,
               i.priority, nextval('agentlease_seq'), i.payload, i.dedup_key, i.max_reclaims,
               v_now, v_now + make_interval(secs => i.delay), i.part, i.context
        FROM unnest(
            p_ids, p_queues, p_priorities, p_payloads, p_dedup_keys, p_max_reclaims, p_delays,
            p_partitions, p_contexts
        ) WITH ORDINALITY
            AS i(id, queue, priority, payload, dedup_key, max_reclaims, delay, part, context,
                 ord)
        ORDER BY i.ord
        ON CONFLICT DO NOTHING
        RETURNING id, queue, dedup_key, partition
    )
    SELECT coalesce(array_agg(c.id), '{}'), coalesce(array_agg(c.queue), '{}'),
           coalesce(array_agg(c.dedup_key), '{}'), coalesce(array_agg(c.partition), '{}')
    INTO v_ids, v_queues, v_keys, v_parts
    FROM created c;

    PERFORM agentlease_unpark(u.q, u.p, v_now)
    FROM (
        SELECT DISTINCT u.q, u.p FROM unnest(v_queues, v_parts) AS u(q, p)
        WHERE u.p IS NOT NULL
    ) u;

    PERFORM pg_notify(n.channel, '') FROM unnest(p_channels) AS n(channel);
    RETURN QUERY SELECT v_ids, v_queues, v_keys;
END
$$;

-- Lease up to p_n ready tasks of p_queue, as agentlease_claim_ranked does, each job with its
-- context.
CREATE FUNCTION agentlease_claim_context(
    p_queue text,
    p_n integer,
    p_lease_for double precision,
    p_max_total double precision,
    p_progress_timeout double precision,
    p_front boolean
)
RETURNS TABLE (
    task_id text,
    reaped text,
    token text,
    attempt integer,
    payload json,
    checkpoint json,
    priority integer,
    failures integer,
    reclaims integer,
    leased_at double precision,
    expires_at double precision,
    rank bigint,
    context json
)
LANGUAGE plpgsql VOLATILE
-- As agentlease_claim: generic plans, index scans only; and nested loops only, so the lease
-- UPDATE finds each picked row by primary key whatever the planner believes.
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz := clock_timestamp();
    v_deadline timestamptz := v_now + make_interval(secs => p_max_total);
    v_timeout  interval := make_interval(secs => p_progress_timeout);
    v_expires  timestamptz := least(
        v_now + make_interval(secs => p_lease_for), v_deadline, v_now + v_timeout
    );
    -- Epoch seconds once per call, not once per row (extract returns numeric).
    v_now_s    double precision := extract(epoch FROM v_now)::float8;
    v_expires_s double precision := extract(epoch FROM v_expires)::float8;
    v_due      boolean;
    v_expired  boolean;
    v_ids      text[];
BEGIN
    SELECT EXISTS (
               SELECT 1 FROM agentlease_tasks w
               WHERE w.queue = p_queue AND w.state IN ('scheduled', 'failed')
                 AND w.run_at <= v_now
           ),
           EXISTS (
               SELECT 1 FROM agentlease_tasks x
               WHERE x.queue = p_queue AND x.state = 'leased' AND x.expires_at <= v_now
           )
    INTO v_due, v_expired;

    IF v_due THEN
        UPDATE agentlease_tasks t
        SET state = 'queued'
        WHERE t.id = ANY (ARRAY(
            SELECT w.id FROM agentlease_tasks w
            WHERE w.queue = p_queue AND w.state IN ('scheduled', 'failed')
              AND w.run_at <= v_now
            FOR UPDATE SKIP LOCKED
        ));
    END IF;

    IF v_expired THEN
        RETURN QUERY
        SELECT r.task_id, r.outcome, NULL::text, r.attempt, NULL::json, NULL::json,
               NULL::integer, NULL::integer, NULL::integer, NULL::float8, NULL::float8,
               NULL::bigint, NULL::json
        FROM agentlease_reap(p_queue, p_front, v_now) r;
    END IF;

    -- The rows stay locked until the call's transaction ends, so the UPDATE below finds them
    -- as picked; other claims skip them.
    v_ids := ARRAY(
        SELECT c.id FROM agentlease_tasks c
        WHERE c.queue = p_queue AND c.state = 'queued'
        ORDER BY c.priority DESC, c.seq
        LIMIT p_n
        FOR UPDATE SKIP LOCKED
    );
    IF cardinality(v_ids) = 0 THEN
        RETURN;
    END IF;

    RETURN QUERY
    UPDATE agentlease_tasks t
    SET state = 'leased',
        token = replace(gen_random_uuid()::text, '-', ''),
        attempt = t.attempt + 1,
        leased_at = v_now,
        expires_at = v_expires,
        lease_deadline = v_deadline,
        progress_timeout = v_timeout,
        progressed_at = v_now
    FROM unnest(v_ids) WITH ORDINALITY AS p(id, rank)
    WHERE t.id = p.id
    RETURNING t.id, NULL::text, t.token, t.attempt, t.payload, t.checkpoint, t.priority,
              t.failures, t.reclaims, v_now_s, v_expires_s, p.rank, t.context;
END
$$;
