-- agentlease on PostgreSQL, schema version 4: partitions (single-writer routing).
--
-- Applied like 0001_initial.sql: in one transaction under the schema's advisory lock, with
-- search_path set to that schema.
--
-- A task may carry a partition (the resource it writes to). The partition is busy while one of
-- its tasks is scheduled, queued, leased or failed; a task that arrives while it is busy is
-- stored 'parked', and when the busy task becomes done or dead the oldest parked task (lowest
-- seq) starts: queued, or scheduled if its run_at is still ahead. So at most one task of a
-- partition is ever busy, and they run in enqueue order.
--
-- Why an advisory lock per partition. Under READ COMMITTED each statement sees the commits made
-- before it started, so a bare "is it busy?" check races:
--   * two enqueues into an idle partition both see it idle and both insert 'queued';
--   * an enqueue sees the last busy task still leased (its completion not yet committed) and
--     parks, while the completion, which cannot see the uncommitted parked row, unparks nothing:
--     the task would stay parked for ever.
-- Every transaction that decides whether a partition is busy (enqueue, requeue_dead, and the
-- trigger below when a task becomes done or dead) first takes pg_advisory_xact_lock on
-- agentlease_partition_key(queue, partition) in one statement, and only then reads, in later
-- statements. A transaction-level lock is released after the commit is visible, and a later
-- statement takes a fresh snapshot, so whoever takes the lock next sees everything the last
-- holder did: the second enqueue sees the first one's task and parks; the completion that waits
-- for the enqueue sees its parked task and starts it, and the enqueue that waits for the
-- completion sees the partition idle and starts its own task. The other transitions (claim,
-- release, a failure that will be retried, promotion, a reap that requeues) move a task from
-- one busy state to another, never change whether its partition is busy, and take no lock.
--
-- Deadlocks. A transaction that may take several partition locks takes them all first, sorted
-- by key (agentlease_lock_partitions): enqueue, requeue_dead, complete_many and reap. A single
-- completion or failure takes one, inside its statement, while it holds its task's row; no
-- holder of a partition lock ever waits for such a row (a partition has one busy task, and the
-- other lock takers touch parked, dead or new rows, or skip locked ones), so no cycle forms.
--
-- Cost: claim, promotion and reaping read the partial indexes of 0001, which never hold a parked
-- task; the partition indexes below hold only busy or parked tasks, never finished ones.

ALTER TABLE agentlease_tasks
    ADD COLUMN partition text,
    DROP CONSTRAINT agentlease_tasks_state,
    ADD CONSTRAINT agentlease_tasks_state CHECK (
        state IN ('parked', 'scheduled', 'queued', 'leased', 'failed', 'done', 'dead')
    );

-- The queue's NOTIFY channel (agentlease._postgres_driver.channel: a hash the server cannot
-- compute), set by enqueue, so that the trigger below can wake idle workers when it starts a
-- parked task.
ALTER TABLE agentlease_queues ADD COLUMN channel text;

CREATE INDEX agentlease_tasks_busy ON agentlease_tasks (queue, partition)
    WHERE partition IS NOT NULL AND state IN ('scheduled', 'queued', 'leased', 'failed');
CREATE INDEX agentlease_tasks_parked ON agentlease_tasks (queue, partition, seq)
    WHERE state = 'parked';

-- The advisory lock key of one partition: schema, queue and partition hashed into a bigint. A
-- collision only makes two partitions wait for each other. search_path is pinned to this
-- schema, so the key is the same whoever calls (the trigger fires for any session's UPDATE).
CREATE FUNCTION agentlease_partition_key(p_queue text, p_partition text) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path FROM CURRENT
AS $$
    SELECT hashtextextended(
        p_partition, hashtextextended(p_queue, hashtextextended(current_schema(), 0))
    )
$$;

-- Take the locks of many partitions (aligned arrays; NULL partitions are skipped) in key order,
-- one at a time: every transaction that takes several takes them in this order, so two of them
-- never wait for each other in a cycle.
CREATE FUNCTION agentlease_lock_partitions(p_queues text[], p_partitions text[]) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_key bigint;
BEGIN
    FOR v_key IN
        SELECT DISTINCT agentlease_partition_key(u.q, u.p) AS k
        FROM unnest(p_queues, p_partitions) AS u(q, p)
        WHERE u.p IS NOT NULL
        ORDER BY k
    LOOP
        PERFORM pg_advisory_xact_lock(v_key);
    END LOOP;
END
$$;

-- Start the partition's oldest parked task if no task of it is busy; the caller holds the
-- partition's lock. Wakes idle workers when the task is ready now.
CREATE FUNCTION agentlease_unpark(p_queue text, p_partition text, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_state text;
BEGIN
    IF EXISTS (
        SELECT 1 FROM agentlease_tasks b
        WHERE b.queue = p_queue AND b.partition = p_partition
          AND b.state IN ('scheduled', 'queued', 'leased', 'failed')
    ) THEN
        RETURN;
    END IF;
    UPDATE agentlease_tasks t
    SET state = CASE WHEN t.run_at > p_now THEN 'scheduled' ELSE 'queued' END
    WHERE t.id = (
        SELECT n.id FROM agentlease_tasks n
        WHERE n.queue = p_queue AND n.partition = p_partition AND n.state = 'parked'
        ORDER BY n.seq
        LIMIT 1
    ) AND t.state = 'parked'
    RETURNING t.state INTO v_state;
    IF v_state = 'queued' THEN
        PERFORM pg_notify(q.channel, '')
        FROM agentlease_queues q WHERE q.name = p_queue AND q.channel IS NOT NULL;
    END IF;
END
$$;

-- A task of a partition became done or dead: lock the partition (its own statement, so the next
-- one reads with a snapshot taken after the lock), then start its next task. It runs at the end
-- of the statement that finished the task, in the same transaction: complete, complete_many,
-- fail, or a reap past max_reclaims, and so does any session's UPDATE of the table.
CREATE FUNCTION agentlease_partition_freed() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(agentlease_partition_key(NEW.queue, NEW.partition));
    PERFORM agentlease_unpark(
        NEW.queue, NEW.partition, coalesce(NEW.finished_at, clock_timestamp())
    );
    RETURN NULL;
END
$$;

CREATE TRIGGER agentlease_tasks_partition_freed
AFTER UPDATE OF state ON agentlease_tasks
FOR EACH ROW
WHEN (
    NEW.partition IS NOT NULL AND NEW.state IN ('done', 'dead')
    AND OLD.state NOT IN ('done', 'dead')
)
EXECUTE FUNCTION agentlease_partition_freed();

-- Enqueue a batch with partitions (one without any is the plain enqueue statement of
-- postgres.sql): one call, one transaction. Registers the queues with their channels (and gives
-- one to a queue made before version 4), locks the batch's partitions, inserts every new task in
-- batch order (skipping one whose id exists, or whose dedup key exists in its queue), a task
-- with a partition as 'parked', then starts the oldest parked task of each partition that is
-- idle (the first new one, unless older ones wait), and notifies the queues. Returns who was
-- created as three aligned arrays (id, queue, dedup key).
CREATE FUNCTION agentlease_enqueue(
    p_ids text[],
    p_queues text[],
    p_priorities integer[],
    p_payloads json[],
    p_dedup_keys text[],
    p_max_reclaims integer[],
    p_delays double precision[],
    p_partitions text[],
    p_queue_names text[],
    p_channels text[]
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
             run_at, partition)
        SELECT i.id, i.queue,
               CASE WHEN i.part IS NOT NULL THEN 'parked'
                    WHEN i.delay > 0 THEN 'scheduled'
                    ELSE 'queued' END,
               i.priority, nextval('agentlease_seq'), i.payload, i.dedup_key, i.max_reclaims,
               v_now, v_now + make_interval(secs => i.delay), i.part
        FROM unnest(
            p_ids, p_queues, p_priorities, p_payloads, p_dedup_keys, p_max_reclaims, p_delays,
            p_partitions
        ) WITH ORDINALITY
            AS i(id, queue, priority, payload, dedup_key, max_reclaims, delay, part, ord)
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

-- Complete many leases in one call (one transaction, one clock reading for the fence). First the
-- rows of the leases given that have a partition are locked, in id order: a second completion
-- of the same lease waits here, holding no partition lock. Then their partitions are locked in
-- key order, so the triggers of the UPDATE, which lock them again row by row in any order, only
-- find locks they hold. Each row is fenced on its own (token, expiry) and updated or not.
CREATE FUNCTION agentlease_complete_many(p_ids text[], p_tokens text[], p_results text[])
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
    RETURNING d.id, d.token;
END
$$;

-- Requeue the queue's dead letters (all, or those of p_ids) with fresh budgets, attempt kept.
-- The rows are picked and locked first, then their partitions (key order); a task with a
-- partition is requeued 'parked' and then the oldest parked task of each partition that is
-- idle starts. Returns whether the queue exists and how many tasks moved; notifies if any did.
CREATE FUNCTION agentlease_requeue_dead(
    p_queue text, p_all boolean, p_ids text[], p_front boolean, p_channel text
)
RETURNS TABLE (queue_exists boolean, requeued integer)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz;
    v_ids   text[];
    v_parts text[];
BEGIN
    IF NOT EXISTS (SELECT 1 FROM agentlease_queues q WHERE q.name = p_queue) THEN
        RETURN QUERY SELECT false, 0;
        RETURN;
    END IF;
    SELECT array_agg(d.id),
           array_agg(DISTINCT d.partition) FILTER (WHERE d.partition IS NOT NULL)
    INTO v_ids, v_parts
    FROM (
        SELECT x.id, x.partition FROM agentlease_tasks x
        WHERE x.queue = p_queue AND x.state = 'dead' AND (p_all OR x.id = ANY (p_ids))
        FOR UPDATE
    ) d;
    IF v_ids IS NULL THEN
        RETURN QUERY SELECT true, 0;
        RETURN;
    END IF;
    IF v_parts IS NOT NULL THEN
        PERFORM agentlease_lock_partitions(
            array_fill(p_queue, ARRAY[cardinality(v_parts)]), v_parts
        );
    END IF;

    v_now := clock_timestamp();
    UPDATE agentlease_tasks t
    SET state = CASE WHEN t.partition IS NULL THEN 'queued' ELSE 'parked' END,
        reclaims = 0, failures = 0, finished_at = NULL, run_at = v_now,
        seq = CASE WHEN p_front THEN agentlease_front(t.seq) ELSE nextval('agentlease_seq') END
    WHERE t.id = ANY (v_ids) AND t.state = 'dead';

    IF v_parts IS NOT NULL THEN
        PERFORM agentlease_unpark(p_queue, p, v_now) FROM unnest(v_parts) AS p;
    END IF;
    PERFORM pg_notify(p_channel, '');
    RETURN QUERY SELECT true, cardinality(v_ids);
END
$$;

-- agentlease_reap (0001) again, with the partitions of the leases it will dead-letter locked
-- first: the expired rows are picked and locked (SKIP LOCKED: whoever holds a row decides), then
-- the partitions of those past max_reclaims (key order), then one UPDATE of exactly those rows,
-- whose triggers find the locks held.
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
           array_agg(e.queue) FILTER (WHERE e.dies AND e.partition IS NOT NULL),
           array_agg(e.partition) FILTER (WHERE e.dies AND e.partition IS NOT NULL)
    INTO v_ids, v_queues, v_parts
    FROM (
        SELECT x.id, x.queue, x.partition, x.reclaims + 1 > x.max_reclaims AS dies
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
        SET state = CASE WHEN t.reclaims + 1 > t.max_reclaims THEN 'dead' ELSE 'queued' END,
            reclaims = t.reclaims + 1,
            token = NULL,
            expires_at = NULL,
            finished_at = CASE
                WHEN t.reclaims + 1 > t.max_reclaims THEN p_now ELSE t.finished_at
            END,
            error = CASE
                WHEN t.reclaims + 1 > t.max_reclaims THEN format(
                    '{"type":"LeaseExpired","message":"lease expired %s times"}', t.reclaims + 1
                )::json
                ELSE t.error
            END,
            seq = CASE
                WHEN t.reclaims + 1 > t.max_reclaims THEN t.seq
                WHEN p_front THEN agentlease_front(t.seq)
                ELSE nextval('agentlease_seq')
            END
        WHERE t.id = ANY (v_ids)
        RETURNING t.id, t.attempt, t.state
    )
    SELECT r.id, r.attempt, CASE WHEN r.state = 'dead' THEN 'dead' ELSE 'requeued' END
    FROM reaped r;
END
$$;
