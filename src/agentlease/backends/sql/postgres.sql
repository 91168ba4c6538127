-- Named queries of the PostgreSQL backend (psycopg placeholders: %(name)s).
--
-- Every query is written to be answered by an index (a partial index by queue, or the primary
-- key), and the backend's connections run with sequential scans, bitmap scans, hash and merge
-- joins off (_postgres_url.PLANNER), so a plan made while the table was small, or with stale
-- statistics, never turns into a scan of every task once it is large.
--
-- The tables live in the URL's schema, which every connection puts first on its search_path; the
-- schema itself is created by the files in postgres_migrations/. Every query here is ONE
-- statement, so it is atomic on its own (the connections run in autocommit mode). Times come from
-- clock_timestamp() inside the statement and cross the seam as epoch seconds (float8). JSON
-- columns hold the exact bytes the client encoded.
--
-- Holder writes are fenced by "id = $id AND token = $token AND expires_at > clock_timestamp()":
-- a token exists only while its task is leased (constraint agentlease_tasks_token), so that is
-- "the caller's lease is the live one", matched through the primary key. They also require
-- "cancel_reason IS NULL": a lease whose task a cancel was asked for takes no more writes (see
-- postgres_migrations/0009_cancel.sql).
--
-- Idempotency keys (key_*) are fenced by "key = $key AND token = $token AND state = 'in_flight'"
-- and the key not past its window (purge_at), with no expiry check: the token, not the clock,
-- decides, so a holder whose in-flight lease ran out still writes until another takes it over.
--
-- Shared-state guards (record_*, counter_*, hold_*, locks_*): each guarded write is one call of a
-- function of postgres_migrations/0003_state.sql (0005_holds.sql for counters and their holds)
-- that locks the rows it decides on; a lock or a hold is live while expires_at >
-- clock_timestamp().

-- name: now
SELECT extract(epoch FROM clock_timestamp())::float8;

-- name: enqueue
-- All or nothing: one statement registers the queues, inserts every new task in batch order (a
-- task whose id exists, or whose dedup key exists in its queue, is skipped) and notifies idle
-- workers; the notification is delivered when the statement commits. Returns who was created
-- as three aligned arrays (id, queue, dedup key).
WITH c AS MATERIALIZED (
    SELECT clock_timestamp() AS now
), queues AS (
    INSERT INTO agentlease_queues (name)
    SELECT DISTINCT name FROM unnest(%(queue)s::text[]) AS q(name)
    ON CONFLICT DO NOTHING
), created AS (
    INSERT INTO agentlease_tasks
        (id, queue, state, priority, seq, payload, dedup_key, max_reclaims, created_at, run_at,
         context)
    SELECT i.id, i.queue, CASE WHEN i.delay > 0 THEN 'scheduled' ELSE 'queued' END, i.priority,
           nextval('agentlease_seq'), i.payload, i.dedup_key, i.max_reclaims, c.now,
           c.now + make_interval(secs => i.delay), i.context
    FROM c, unnest(
        %(id)s::text[], %(queue)s::text[], %(priority)s::integer[], %(payload)s::json[],
        %(dedup_key)s::text[], %(max_reclaims)s::integer[], %(delay)s::float8[],
        %(context)s::json[]
    ) WITH ORDINALITY
        AS i(id, queue, priority, payload, dedup_key, max_reclaims, delay, context, ord)
    ORDER BY i.ord
    ON CONFLICT DO NOTHING
    RETURNING id, queue, dedup_key
)
SELECT array(SELECT id FROM created), array(SELECT queue FROM created),
       array(SELECT dedup_key FROM created),
       (SELECT count(pg_notify(ch, '')) FROM unnest(%(channels)s::text[]) AS n(ch));

-- name: enqueue_partitioned
-- A batch with partitions: one call of agentlease_enqueue_context() (postgres_migrations/
-- 0008_task_context.sql; agentlease_enqueue() of 0004_partitions.sql with the tasks' contexts),
-- all or nothing, which also parks each task of a busy partition. Returns who was created as
-- three aligned arrays (id, queue, dedup key).
SELECT ids, queues, dedup_keys
FROM agentlease_enqueue_context(
    %(id)s::text[], %(queue)s::text[], %(priority)s::integer[], %(payload)s::json[],
    %(dedup_key)s::text[], %(max_reclaims)s::integer[], %(delay)s::float8[],
    %(partition)s::text[], %(queue_names)s::text[], %(channels)s::text[], %(context)s::json[]
);

-- name: find_existing
-- Two index lookups (primary key; the dedup index), not one OR that only a table scan answers.
SELECT id, queue, dedup_key FROM agentlease_tasks WHERE id = ANY(%(id)s::text[])
UNION
SELECT t.id, t.queue, t.dedup_key
FROM unnest(%(queue)s::text[], %(dedup_key)s::text[]) AS k(queue, dedup_key)
JOIN agentlease_tasks t ON t.queue = k.queue AND t.dedup_key = k.dedup_key;

-- name: claim
-- One call of agentlease_claim_holder() (postgres_migrations/0011_workers.sql;
-- agentlease_claim_context() of 0008_task_context.sql that writes the claim's holder and returns
-- each job's due time): the reaped leases and the jobs, each job with its rank in pick order (the
-- rows come in no order). The attempt history is written by the triggers of 0011_workers.sql, in
-- this statement.
SELECT task_id, reaped, token, attempt, payload, checkpoint, priority, failures, reclaims,
       leased_at, expires_at, rank, context, run_at
FROM agentlease_claim_holder(
    %(queue)s::text, %(n)s::integer, %(lease_for)s::float8, %(max_total)s::float8,
    %(progress_timeout)s::float8, %(front)s::boolean, %(holder)s::text
);

-- name: reap
SELECT task_id, attempt, outcome
FROM agentlease_reap(%(queue)s::text, %(front)s::boolean, clock_timestamp());

-- name: extend
-- Many leases in one statement (see agentlease_extend).
SELECT task_id, token, expires_at
FROM agentlease_extend(%(id)s::text[], %(token)s::text[], %(lease_for)s::float8);

-- name: complete
UPDATE agentlease_tasks
SET state = 'done', result = %(result)s::json, finished_at = clock_timestamp(), token = NULL,
    expires_at = NULL
WHERE id = %(id)s AND token = %(token)s AND expires_at > clock_timestamp()
  AND cancel_reason IS NULL;

-- name: complete_many
-- One call of agentlease_complete_many() (postgres_migrations/0004_partitions.sql): each row is
-- fenced on its own (token, expiry) and updated or not, in one transaction.
SELECT task_id, token
FROM agentlease_complete_many(%(ids)s::text[], %(tokens)s::text[], %(results)s::text[]);

-- name: fail_retry
-- Notifies idle workers in the same statement (delivered at commit).
WITH failed AS (
    UPDATE agentlease_tasks
    SET state = 'failed', failures = failures + 1, error = %(error)s::json,
        run_at = clock_timestamp() + make_interval(secs => %(retry_in)s::float8),
        token = NULL, expires_at = NULL
    WHERE id = %(id)s AND token = %(token)s AND expires_at > clock_timestamp()
  AND cancel_reason IS NULL
    RETURNING *
)
SELECT f.id, f.queue, f.state, f.priority, f.payload, f.attempt, f.reclaims, f.failures,
       f.max_reclaims, extract(epoch FROM f.created_at)::float8,
       extract(epoch FROM f.run_at)::float8, f.dedup_key, extract(epoch FROM f.leased_at)::float8,
       extract(epoch FROM f.expires_at)::float8, extract(epoch FROM f.finished_at)::float8,
       f.progress, f.checkpoint, f.result, f.error, f.partition, f.context,
       pg_notify(%(channel)s, '')::text
FROM failed f;

-- name: fail_dead
UPDATE agentlease_tasks
SET state = 'dead', failures = failures + 1, error = %(error)s::json,
    finished_at = clock_timestamp(), token = NULL, expires_at = NULL
WHERE id = %(id)s AND token = %(token)s AND expires_at > clock_timestamp()
  AND cancel_reason IS NULL
RETURNING id, queue, state, priority, payload, attempt, reclaims, failures, max_reclaims,
          extract(epoch FROM created_at)::float8, extract(epoch FROM run_at)::float8, dedup_key,
          extract(epoch FROM leased_at)::float8, extract(epoch FROM expires_at)::float8,
          extract(epoch FROM finished_at)::float8, progress, checkpoint, result, error,
          partition, context;

-- name: release
-- Notifies idle workers in the same statement (delivered at commit).
WITH released AS (
    UPDATE agentlease_tasks
    SET state = 'queued', token = NULL, expires_at = NULL,
        seq = CASE WHEN %(front)s::boolean THEN agentlease_front(seq)
                   ELSE nextval('agentlease_seq') END
    WHERE id = %(id)s AND token = %(token)s AND expires_at > clock_timestamp()
  AND cancel_reason IS NULL
    RETURNING id
)
SELECT count(pg_notify(%(channel)s, '')) FROM released;

-- name: progress
UPDATE agentlease_tasks
SET progress = %(progress)s::json, checkpoint = coalesce(%(checkpoint)s::json, checkpoint),
    progressed_at = clock_timestamp()
WHERE id = %(id)s AND token = %(token)s AND expires_at > clock_timestamp()
  AND cancel_reason IS NULL;

-- name: fence_state
-- Why a fenced write was refused: read after the refusal, in a statement of its own.
SELECT attempt, state, token, expires_at > clock_timestamp(), cancel_reason FROM agentlease_tasks
WHERE id = %(id)s;

-- name: get
SELECT id, queue, state, priority, payload, attempt, reclaims, failures, max_reclaims,
       extract(epoch FROM created_at)::float8, extract(epoch FROM run_at)::float8, dedup_key,
       extract(epoch FROM leased_at)::float8, extract(epoch FROM expires_at)::float8,
       extract(epoch FROM finished_at)::float8, progress, checkpoint, result, error, partition,
       context, cancel_reason,
       (SELECT json_agg(json_build_object(
                   'attempt', a.attempt, 'worker', a.worker,
                   'started', extract(epoch FROM a.started)::float8,
                   'ended', extract(epoch FROM a.ended)::float8,
                   'outcome', a.outcome, 'error', a.error) ORDER BY a.attempt)::text
        FROM agentlease_attempts a WHERE a.task_id = %(id)s),
       holder
FROM agentlease_tasks WHERE id = %(id)s;

-- name: cancel
-- One call of agentlease_cancel() (postgres_migrations/0009_cancel.sql).
SELECT outcome, state, error FROM agentlease_cancel(%(id)s::text, %(reason)s::text, %(error)s::json);

-- name: delete_queue
-- One call of agentlease_delete_queue() (postgres_migrations/0009_cancel.sql): one batch.
SELECT deleted, gone, leased
FROM agentlease_delete_queue(%(queue)s::text, %(limit)s::integer, %(force)s::boolean);

-- name: stats
-- One statement, so one snapshot for every count; each count reads one partial index. The hot
-- partitions (the five with the most parked tasks, most first, ties by name in code-point order)
-- are two aligned arrays, read from the parked index.
WITH hot AS (
    SELECT partition, count(*) AS n FROM agentlease_tasks
    WHERE queue = %(queue)s AND state = 'parked'
    GROUP BY partition
    ORDER BY n DESC, partition COLLATE "C"
    LIMIT 5
)
SELECT EXISTS (SELECT 1 FROM agentlease_queues WHERE name = %(queue)s),
       extract(epoch FROM c.now)::float8,
       (SELECT count(*) FROM agentlease_tasks WHERE queue = %(queue)s AND state = 'parked'),
       (SELECT count(*) FROM agentlease_tasks WHERE queue = %(queue)s AND state = 'scheduled'),
       (SELECT count(*) FROM agentlease_tasks WHERE queue = %(queue)s AND state = 'queued'),
       (SELECT count(*) FROM agentlease_tasks WHERE queue = %(queue)s AND state = 'leased'),
       (SELECT count(*) FROM agentlease_tasks WHERE queue = %(queue)s AND state = 'failed'),
       (SELECT count(*) FROM agentlease_tasks WHERE queue = %(queue)s AND state = 'done'),
       (SELECT count(*) FROM agentlease_tasks WHERE queue = %(queue)s AND state = 'dead'),
       (SELECT count(*) FROM agentlease_tasks WHERE queue = %(queue)s AND state = 'cancelled'),
       (SELECT extract(epoch FROM c.now - min(created_at))::float8 FROM agentlease_tasks
        WHERE queue = %(queue)s AND state = 'queued'),
       array(SELECT h.partition FROM hot h ORDER BY h.n DESC, h.partition COLLATE "C"),
       array(SELECT h.n FROM hot h ORDER BY h.n DESC, h.partition COLLATE "C")
FROM (SELECT clock_timestamp() AS now) c;

-- name: queues
SELECT name FROM agentlease_queues ORDER BY name;

-- name: inspect
-- One row with NULLs after the first column when the queue has no live lease; none when the
-- queue does not exist.
SELECT q.now, l.id, l.attempt, l.leased_at, l.expires_at, l.reclaims, l.failures, l.holder
FROM (
    SELECT name, extract(epoch FROM clock_timestamp())::float8 AS now, clock_timestamp() AS ts
    FROM agentlease_queues WHERE name = %(queue)s
) q
LEFT JOIN LATERAL (
    SELECT id, attempt, extract(epoch FROM leased_at)::float8 AS leased_at,
           extract(epoch FROM expires_at)::float8 AS expires_at, reclaims, failures, holder
    FROM agentlease_tasks
    WHERE queue = q.name AND state = 'leased' AND expires_at > q.ts
    ORDER BY expires_at, id
    LIMIT %(limit)s
) l ON true;

-- name: dead
-- One row of NULLs when the queue has no dead letters; none when the queue does not exist.
SELECT t.id, t.queue, t.state, t.priority, t.payload, t.attempt, t.reclaims, t.failures,
       t.max_reclaims, extract(epoch FROM t.created_at)::float8,
       extract(epoch FROM t.run_at)::float8, t.dedup_key,
       extract(epoch FROM t.leased_at)::float8, extract(epoch FROM t.expires_at)::float8,
       extract(epoch FROM t.finished_at)::float8, t.progress, t.checkpoint, t.result, t.error,
       t.partition, t.context
FROM agentlease_queues q
LEFT JOIN LATERAL (
    SELECT * FROM agentlease_tasks d
    WHERE d.queue = q.name AND d.state = 'dead'
    ORDER BY d.finished_at DESC, d.id
    LIMIT %(limit)s
) t ON true
WHERE q.name = %(queue)s;

-- name: requeue_dead
-- One call of agentlease_requeue_dead() (postgres_migrations/0004_partitions.sql): fresh
-- budgets, attempt kept (fencing stays monotonic), parked behind a busy partition; notifies
-- idle workers if any moved.
SELECT queue_exists, requeued
FROM agentlease_requeue_dead(
    %(queue)s::text, %(all)s::boolean, %(ids)s::text[], %(front)s::boolean, %(channel)s::text
);

-- name: worker_register
-- One statement: delete up to 100 lapsed entries of other workers, then write this one.
WITH c AS MATERIALIZED (
    SELECT clock_timestamp() AS now
), lapsed AS (
    DELETE FROM agentlease_workers
    WHERE id IN (SELECT w.id FROM agentlease_workers w, c
                 WHERE w.expires_at <= c.now AND w.id <> %(id)s LIMIT 100)
)
INSERT INTO agentlease_workers (id, info, beat_at, expires_at)
SELECT %(id)s, %(info)s::json, c.now, c.now + make_interval(secs => %(ttl)s::float8) FROM c
ON CONFLICT (id) DO UPDATE
SET info = EXCLUDED.info, beat_at = EXCLUDED.beat_at, expires_at = EXCLUDED.expires_at
RETURNING extract(epoch FROM expires_at)::float8;

-- name: workers
SELECT id, info, extract(epoch FROM beat_at)::float8, extract(epoch FROM expires_at)::float8
FROM agentlease_workers WHERE expires_at > clock_timestamp() ORDER BY id COLLATE "C";

-- name: worker_unregister
DELETE FROM agentlease_workers WHERE id = %(id)s;

-- name: key_reserve
-- One call of agentlease_reserve_key() (postgres_migrations/0006_leaner_calls.sql): insert,
-- take over or report the key, in one transaction on one clock reading.
SELECT reserved, taken_over, key, state, fingerprint, fence, holder, expires_at, result, error,
       created_at, finished_at, purge_at, now
FROM agentlease_reserve_key(
    %(key)s::text, %(fingerprint)s::text, %(holder)s::text, %(hold_for)s::float8,
    %(window)s::float8
);

-- name: key_extend
-- The dedup window keeps its distance from the in-flight lease, and never shrinks.
WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now)
UPDATE agentlease_keys k
SET expires_at = c.now + make_interval(secs => %(hold_for)s::float8),
    purge_at = greatest(
        k.purge_at,
        c.now + make_interval(secs => %(hold_for)s::float8) + (k.purge_at - k.expires_at)
    )
FROM c
WHERE k.key = %(key)s AND k.token = %(token)s AND k.state = 'in_flight' AND k.purge_at > c.now
RETURNING extract(epoch FROM k.expires_at)::float8;

-- name: key_finish
-- complete_key (state 'done', a result) and fail_key (state 'failed', an error).
WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now)
UPDATE agentlease_keys k
SET state = %(state)s::text, result = %(result)s::bytea, error = %(error)s::bytea,
    finished_at = c.now, token = NULL, holder = '', expires_at = NULL,
    purge_at = c.now + make_interval(secs => %(window)s::float8)
FROM c
WHERE k.key = %(key)s AND k.token = %(token)s AND k.state = 'in_flight' AND k.purge_at > c.now;

-- name: key_release
WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now)
UPDATE agentlease_keys k
SET token = NULL, holder = '', expires_at = c.now
FROM c
WHERE k.key = %(key)s AND k.token = %(token)s AND k.state = 'in_flight' AND k.purge_at > c.now;

-- name: key_fence
-- Why a fenced key write was refused: read after the refusal, in a statement of its own.
SELECT fence, state FROM agentlease_keys WHERE key = %(key)s AND purge_at > clock_timestamp();

-- name: key_get
SELECT k.key, k.state, k.fingerprint, k.fence, k.holder,
       extract(epoch FROM k.expires_at)::float8, k.result, k.error,
       extract(epoch FROM k.created_at)::float8, extract(epoch FROM k.finished_at)::float8,
       extract(epoch FROM k.purge_at)::float8, extract(epoch FROM c.now)::float8
FROM (SELECT clock_timestamp() AS now) c
JOIN agentlease_keys k ON k.key = %(key)s AND k.purge_at > c.now;

-- name: purge_done
-- Up to %(limit)s done tasks of the queue that finished %(older_than)s seconds ago or earlier,
-- oldest first, through the partial index agentlease_tasks_done (queue, finished_at), bounded by
-- the clock read once. Rows another transaction holds are skipped; the rows picked stay locked
-- until the DELETE, which finds them by primary key (an array, so that no plan joins the whole
-- table). One statement: one atomic step. The state is written out (not a parameter) so that a
-- generic plan still matches the partial index.
WITH doomed AS MATERIALIZED (
    SELECT t.id FROM agentlease_tasks t
    WHERE t.queue = %(queue)s AND t.state = 'done'
      AND t.finished_at <= (SELECT clock_timestamp()) - make_interval(secs => %(older_than)s::float8)
    ORDER BY t.finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM agentlease_tasks t WHERE t.id = ANY (ARRAY(SELECT d.id FROM doomed d));

-- name: purge_dead
-- As purge_done, for dead letters, through agentlease_tasks_dead.
WITH doomed AS MATERIALIZED (
    SELECT t.id FROM agentlease_tasks t
    WHERE t.queue = %(queue)s AND t.state = 'dead'
      AND t.finished_at <= (SELECT clock_timestamp()) - make_interval(secs => %(older_than)s::float8)
    ORDER BY t.finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM agentlease_tasks t WHERE t.id = ANY (ARRAY(SELECT d.id FROM doomed d));

-- name: purge_cancelled
-- As purge_done, for cancelled tasks, through agentlease_tasks_cancelled (0009_cancel.sql).
WITH doomed AS MATERIALIZED (
    SELECT t.id FROM agentlease_tasks t
    WHERE t.queue = %(queue)s AND t.state = 'cancelled'
      AND t.finished_at <= (SELECT clock_timestamp()) - make_interval(secs => %(older_than)s::float8)
    ORDER BY t.finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM agentlease_tasks t WHERE t.id = ANY (ARRAY(SELECT d.id FROM doomed d));

-- name: state_purge
-- Expired retry budgets and circuit breakers, and the receipts of plans past their purge_at, up
-- to %(limit)s of each, in one statement, each read through its expiry index (0010_retention.sql,
-- 0012_plans.sql), visiting only the rows it deletes.
-- FOR UPDATE re-checks expires_at on a row another transaction just renewed, and SKIP LOCKED
-- passes over a row being written now.
WITH budgets AS (
    DELETE FROM agentlease_budgets b WHERE b.key = ANY (ARRAY(
        SELECT x.key FROM agentlease_budgets x
        WHERE x.expires_at <= (SELECT clock_timestamp())
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING 1
), breakers AS (
    DELETE FROM agentlease_breakers b WHERE b.key = ANY (ARRAY(
        SELECT x.key FROM agentlease_breakers x
        WHERE x.expires_at <= (SELECT clock_timestamp())
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING 1
), plans AS (
    DELETE FROM agentlease_plans p WHERE p.id = ANY (ARRAY(
        SELECT x.id FROM agentlease_plans x
        WHERE x.purge_at <= (SELECT clock_timestamp())
        ORDER BY x.purge_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING 1
)
SELECT (SELECT count(*) FROM budgets) + (SELECT count(*) FROM breakers)
       + (SELECT count(*) FROM plans);

-- name: list_queued
-- Listings, one page each, through the state's partial index: the first page from the index's
-- start; a later one from the cursor's position: the rows tied with it on the index's values
-- (after it by seq or id), then the rows past them, each part one range of the index, at most
-- %(limit)s rows each. The last two columns are for the cursor: seq, and the index's time in
-- whole microseconds (exact, where epoch seconds as a double may not be).
SELECT t.id, t.queue, t.state, t.priority, t.payload, t.attempt, t.reclaims, t.failures,
       t.max_reclaims, extract(epoch FROM t.created_at)::float8,
       extract(epoch FROM t.run_at)::float8, t.dedup_key,
       extract(epoch FROM t.leased_at)::float8, extract(epoch FROM t.expires_at)::float8,
       extract(epoch FROM t.finished_at)::float8, t.progress, t.checkpoint, t.result, t.error,
       t.partition, t.context, t.seq,
       (extract(epoch FROM t.expires_at) * 1000000)::bigint AS us,
       t.cancel_reason
FROM agentlease_tasks t
WHERE t.queue = %(queue)s AND t.state = 'queued'
ORDER BY t.priority DESC, t.seq LIMIT %(limit)s;

-- name: list_queued_after
(SELECT t.id, t.queue, t.state, t.priority, t.payload, t.attempt, t.reclaims, t.failures,
       t.max_reclaims, extract(epoch FROM t.created_at)::float8,
       extract(epoch FROM t.run_at)::float8, t.dedup_key,
       extract(epoch FROM t.leased_at)::float8, extract(epoch FROM t.expires_at)::float8,
       extract(epoch FROM t.finished_at)::float8, t.progress, t.checkpoint, t.result, t.error,
       t.partition, t.context, t.seq,
       (extract(epoch FROM t.expires_at) * 1000000)::bigint AS us,
       t.cancel_reason
FROM agentlease_tasks t
WHERE t.queue = %(queue)s AND t.state = 'queued' AND t.priority = %(p)s AND t.seq > %(s)s
ORDER BY t.seq LIMIT %(limit)s)
UNION ALL
(SELECT t.id, t.queue, t.state, t.priority, t.payload, t.attempt, t.reclaims, t.failures,
       t.max_reclaims, extract(epoch FROM t.created_at)::float8,
       extract(epoch FROM t.run_at)::float8, t.dedup_key,
       extract(epoch FROM t.leased_at)::float8, extract(epoch FROM t.expires_at)::float8,
       extract(epoch FROM t.finished_at)::float8, t.progress, t.checkpoint, t.result, t.error,
       t.partition, t.context, t.seq,
       (extract(epoch FROM t.expires_at) * 1000000)::bigint AS us,
       t.cancel_reason
FROM agentlease_tasks t
WHERE t.queue = %(queue)s AND t.state = 'queued' AND t.priority < %(p)s
ORDER BY t.priority DESC, t.seq LIMIT %(limit)s)
ORDER BY 4 DESC, 22 LIMIT %(limit)s;

-- name: list_leased
SELECT t.id, t.queue, t.state, t.priority, t.payload, t.attempt, t.reclaims, t.failures,
       t.max_reclaims, extract(epoch FROM t.created_at)::float8,
       extract(epoch FROM t.run_at)::float8, t.dedup_key,
       extract(epoch FROM t.leased_at)::float8, extract(epoch FROM t.expires_at)::float8,
       extract(epoch FROM t.finished_at)::float8, t.progress, t.checkpoint, t.result, t.error,
       t.partition, t.context, t.seq,
       (extract(epoch FROM t.expires_at) * 1000000)::bigint AS us,
       t.cancel_reason
FROM agentlease_tasks t
WHERE t.queue = %(queue)s AND t.state = 'leased'
ORDER BY t.expires_at, t.id LIMIT %(limit)s;

-- name: list_leased_after
(SELECT t.id, t.queue, t.state, t.priority, t.payload, t.attempt, t.reclaims, t.failures,
       t.max_reclaims, extract(epoch FROM t.created_at)::float8,
       extract(epoch FROM t.run_at)::float8, t.dedup_key,
       extract(epoch FROM t.leased_at)::float8, extract(epoch FROM t.expires_at)::float8,
       extract(epoch FROM t.finished_at)::float8, t.progress, t.checkpoint, t.result, t.error,
       t.partition, t.context, t.seq,
       (extract(epoch FROM t.expires_at) * 1000000)::bigint AS us,
       t.cancel_reason
FROM agentlease_tasks t
WHERE t.queue = %(queue)s AND t.state = 'leased' AND t.expires_at = 'epoch'::timestamptz + %(us)s::bigint * interval '1 microsecond' AND t.id > %(id)s
ORDER BY t.id LIMIT %(limit)s)
UNION ALL
(SELECT t.id, t.queue, t.state, t.priority, t.payload, t.attempt, t.reclaims, t.failures,
       t.max_reclaims, extract(epoch FROM t.created_at)::float8,
       extract(epoch FROM t.run_at)::float8, t.dedup_key,
       extract(epoch FROM t.leased_at)::float8, extract(epoch FROM t.expires_at)::float8,
       extract(epoch FROM t.finished_at)::float8, t.progress, t.checkpoint, t.result, t.error,
       t.partition, t.context, t.seq,
       (extract(epoch FROM t.expires_at) * 1000000)::bigint AS us,
       t.cancel_reason
FROM agentlease_tasks t
WHERE t.queue = %(queue)s AND t.state = 'leased' AND t.expires_at > 'epoch'::timestamptz + %(us)s::bigint * interval '1 microsecond'
ORDER BY t.expires_at, t.id LIMIT %(limit)s)
ORDER BY 23, 1 LIMIT %(limit)s;

-- name: list_done
SELECT t.id, t.queue, t.state, t.priority, t.payload, t.attempt, t.reclaims, t.failures,
       t.max_reclaims, extract(epoch FROM t.created_at)::float8,
       extract(epoch FROM t.run_at)::float8, t.dedup_key,
       extract(epoch FROM t.leased_at)::float8, extract(epoch FROM t.expires_at)::float8,
       extract(epoch FROM t.finished_at)::float8, t.progress, t.checkpoint, t.result, t.error,
       t.partition, t.context, t.seq,
       (extract(epoch FROM t.finished_at) * 1000000)::bigint AS us,
       t.cancel_reason
FROM agentlease_tasks t
WHERE t.queue = %(queue)s AND t.state = 'done'
ORDER BY t.finished_at DESC, t.id DESC LIMIT %(limit)s;

-- name: list_done_after
(SELECT t.id, t.queue, t.state, t.priority, t.payload, t.attempt, t.reclaims, t.failures,
       t.max_reclaims, extract(epoch FROM t.created_at)::float8,
       extract(epoch FROM t.run_at)::float8, t.dedup_key,
       extract(epoch FROM t.leased_at)::float8, extract(epoch FROM t.expires_at)::float8,
       extract(epoch FROM t.finished_at)::float8, t.progress, t.checkpoint, t.result, t.error,
       t.partition, t.context, t.seq,
       (extract(epoch FROM t.finished_at) * 1000000)::bigint AS us,
       t.cancel_reason
FROM agentlease_tasks t
WHERE t.queue = %(queue)s AND t.state = 'done' AND t.finished_at = 'epoch'::timestamptz + %(us)s::bigint * interval '1 microsecond' AND t.id < %(id)s
ORDER BY t.id DESC LIMIT %(limit)s)
UNION ALL
(SELECT t.id, t.queue, t.state, t.priority, t.payload, t.attempt, t.reclaims, t.failures,
       t.max_reclaims, extract(epoch FROM t.created_at)::float8,
       extract(epoch FROM t.run_at)::float8, t.dedup_key,
       extract(epoch FROM t.leased_at)::float8, extract(epoch FROM t.expires_at)::float8,
       extract(epoch FROM t.finished_at)::float8, t.progress, t.checkpoint, t.result, t.error,
       t.partition, t.context, t.seq,
       (extract(epoch FROM t.finished_at) * 1000000)::bigint AS us,
       t.cancel_reason
FROM agentlease_tasks t
WHERE t.queue = %(queue)s AND t.state = 'done' AND t.finished_at < 'epoch'::timestamptz + %(us)s::bigint * interval '1 microsecond'
ORDER BY t.finished_at DESC, t.id DESC LIMIT %(limit)s)
ORDER BY 23 DESC, 1 DESC LIMIT %(limit)s;

-- name: list_dead
SELECT t.id, t.queue, t.state, t.priority, t.payload, t.attempt, t.reclaims, t.failures,
       t.max_reclaims, extract(epoch FROM t.created_at)::float8,
       extract(epoch FROM t.run_at)::float8, t.dedup_key,
       extract(epoch FROM t.leased_at)::float8, extract(epoch FROM t.expires_at)::float8,
       extract(epoch FROM t.finished_at)::float8, t.progress, t.checkpoint, t.result, t.error,
       t.partition, t.context, t.seq,
       (extract(epoch FROM t.finished_at) * 1000000)::bigint AS us,
       t.cancel_reason
FROM agentlease_tasks t
WHERE t.queue = %(queue)s AND t.state = 'dead'
ORDER BY t.finished_at DESC, t.id DESC LIMIT %(limit)s;

-- name: list_dead_after
(SELECT t.id, t.queue, t.state, t.priority, t.payload, t.attempt, t.reclaims, t.failures,
       t.max_reclaims, extract(epoch FROM t.created_at)::float8,
       extract(epoch FROM t.run_at)::float8, t.dedup_key,
       extract(epoch FROM t.leased_at)::float8, extract(epoch FROM t.expires_at)::float8,
       extract(epoch FROM t.finished_at)::float8, t.progress, t.checkpoint, t.result, t.error,
       t.partition, t.context, t.seq,
       (extract(epoch FROM t.finished_at) * 1000000)::bigint AS us,
       t.cancel_reason
FROM agentlease_tasks t
WHERE t.queue = %(queue)s AND t.state = 'dead' AND t.finished_at = 'epoch'::timestamptz + %(us)s::bigint * interval '1 microsecond' AND t.id < %(id)s
ORDER BY t.id DESC LIMIT %(limit)s)
UNION ALL
(SELECT t.id, t.queue, t.state, t.priority, t.payload, t.attempt, t.reclaims, t.failures,
       t.max_reclaims, extract(epoch FROM t.created_at)::float8,
       extract(epoch FROM t.run_at)::float8, t.dedup_key,
       extract(epoch FROM t.leased_at)::float8, extract(epoch FROM t.expires_at)::float8,
       extract(epoch FROM t.finished_at)::float8, t.progress, t.checkpoint, t.result, t.error,
       t.partition, t.context, t.seq,
       (extract(epoch FROM t.finished_at) * 1000000)::bigint AS us,
       t.cancel_reason
FROM agentlease_tasks t
WHERE t.queue = %(queue)s AND t.state = 'dead' AND t.finished_at < 'epoch'::timestamptz + %(us)s::bigint * interval '1 microsecond'
ORDER BY t.finished_at DESC, t.id DESC LIMIT %(limit)s)
ORDER BY 23 DESC, 1 DESC LIMIT %(limit)s;

-- name: list_cancelled
SELECT t.id, t.queue, t.state, t.priority, t.payload, t.attempt, t.reclaims, t.failures,
       t.max_reclaims, extract(epoch FROM t.created_at)::float8,
       extract(epoch FROM t.run_at)::float8, t.dedup_key,
       extract(epoch FROM t.leased_at)::float8, extract(epoch FROM t.expires_at)::float8,
       extract(epoch FROM t.finished_at)::float8, t.progress, t.checkpoint, t.result, t.error,
       t.partition, t.context, t.seq,
       (extract(epoch FROM t.finished_at) * 1000000)::bigint AS us,
       t.cancel_reason
FROM agentlease_tasks t
WHERE t.queue = %(queue)s AND t.state = 'cancelled'
ORDER BY t.finished_at DESC, t.id DESC LIMIT %(limit)s;

-- name: list_cancelled_after
(SELECT t.id, t.queue, t.state, t.priority, t.payload, t.attempt, t.reclaims, t.failures,
       t.max_reclaims, extract(epoch FROM t.created_at)::float8,
       extract(epoch FROM t.run_at)::float8, t.dedup_key,
       extract(epoch FROM t.leased_at)::float8, extract(epoch FROM t.expires_at)::float8,
       extract(epoch FROM t.finished_at)::float8, t.progress, t.checkpoint, t.result, t.error,
       t.partition, t.context, t.seq,
       (extract(epoch FROM t.finished_at) * 1000000)::bigint AS us,
       t.cancel_reason
FROM agentlease_tasks t
WHERE t.queue = %(queue)s AND t.state = 'cancelled' AND t.finished_at = 'epoch'::timestamptz + %(us)s::bigint * interval '1 microsecond' AND t.id < %(id)s
ORDER BY t.id DESC LIMIT %(limit)s)
UNION ALL
(SELECT t.id, t.queue, t.state, t.priority, t.payload, t.attempt, t.reclaims, t.failures,
       t.max_reclaims, extract(epoch FROM t.created_at)::float8,
       extract(epoch FROM t.run_at)::float8, t.dedup_key,
       extract(epoch FROM t.leased_at)::float8, extract(epoch FROM t.expires_at)::float8,
       extract(epoch FROM t.finished_at)::float8, t.progress, t.checkpoint, t.result, t.error,
       t.partition, t.context, t.seq,
       (extract(epoch FROM t.finished_at) * 1000000)::bigint AS us,
       t.cancel_reason
FROM agentlease_tasks t
WHERE t.queue = %(queue)s AND t.state = 'cancelled' AND t.finished_at < 'epoch'::timestamptz + %(us)s::bigint * interval '1 microsecond'
ORDER BY t.finished_at DESC, t.id DESC LIMIT %(limit)s)
ORDER BY 23 DESC, 1 DESC LIMIT %(limit)s;

-- name: key_purge
-- Oldest first through the purge_at index, bounded by the clock read once (a volatile call in
-- the condition could not bound an index scan). Rows another transaction holds (a reserve
-- taking the key over right now) are skipped; the rows picked stay locked until the DELETE, so
-- it needs no second look at purge_at and finds them by primary key.
WITH doomed AS MATERIALIZED (
    SELECT k.key FROM agentlease_keys k
    WHERE k.purge_at <= (SELECT clock_timestamp())
    ORDER BY k.purge_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM agentlease_keys k WHERE k.key = ANY (ARRAY(SELECT d.key FROM doomed d));

-- name: record_get
-- One statement, so one snapshot of the record's row and fields (two arrays aligned by field).
SELECT r.version, r.fence, extract(epoch FROM r.updated_at)::float8,
       array(SELECT f.field FROM agentlease_record_fields f
             WHERE f.key = r.key ORDER BY f.field),
       array(SELECT f.value FROM agentlease_record_fields f
             WHERE f.key = r.key ORDER BY f.field)
FROM agentlease_records r WHERE r.key = %(key)s;

-- name: record_write
-- One call of agentlease_write_record() (postgres_migrations/0006_leaner_calls.sql): lock,
-- check, write, in one transaction.
SELECT outcome, version, fence, updated_at, fields, vals
FROM agentlease_write_record(
    %(key)s::text, %(fields)s::text[], %(values)s::bytea[], %(replace)s::boolean,
    %(expected)s::bigint, %(guard)s::text, %(allowed)s::bytea[], %(allow_absent)s::boolean,
    %(fence)s::bigint
);

-- name: record_replace
-- record_write for a replacing write: the record's fields come back only with a refusal (after
-- a write they are the fields written), so a write's reply carries no arrays to parse.
SELECT outcome, version, fence, updated_at,
       CASE WHEN outcome = 'ok' THEN NULL ELSE fields END AS fields,
       CASE WHEN outcome = 'ok' THEN NULL ELSE vals END AS vals
FROM agentlease_write_record(
    %(key)s::text, %(fields)s::text[], %(values)s::bytea[], %(replace)s::boolean,
    %(expected)s::bigint, %(guard)s::text, %(allowed)s::bytea[], %(allow_absent)s::boolean,
    %(fence)s::bigint
);

-- name: counter_add
SELECT added, value
FROM agentlease_add_counter(%(name)s::text, %(delta)s::bigint, %(low)s::bigint, %(high)s::bigint);

-- name: counter_get
-- The value as a sweep would leave it: without the units of the counter's holds that ran out
-- (one statement, one snapshot).
SELECT c.value - coalesce((SELECT sum(h.units) FROM agentlease_counter_holds h
                           WHERE h.name = c.name AND h.expires_at <= clock_timestamp()), 0)::bigint
FROM agentlease_counters c WHERE c.name = %(name)s;

-- name: counter_version
-- A counter's value and version as the next step on it will find them (0012_plans.sql): the
-- holds that ran out and are not yet given back leave their units out of the value and add one
-- each to the version. One statement: the sum and the count come from one scan of the holds.
SELECT c.value - coalesce(h.units, 0)::bigint, c.version + h.gone
FROM agentlease_counters c,
LATERAL (SELECT sum(x.units) AS units, count(*) FILTER (WHERE x.units <> 0) AS gone
         FROM agentlease_counter_holds x
         WHERE x.name = c.name AND x.expires_at <= clock_timestamp()) h
WHERE c.name = %(name)s;

-- name: hold_counter
SELECT added, value
FROM agentlease_hold_counter(
    %(name)s::text, %(token)s::text, %(units)s::bigint, %(high)s::bigint, %(ttl)s::float8
);

-- name: hold_extend
-- Renew a live hold (postgres_migrations/0005_holds.sql): one UPDATE of its row only.
UPDATE agentlease_counter_holds
SET expires_at = clock_timestamp() + make_interval(secs => %(ttl)s::float8)
WHERE name = %(name)s AND token = %(token)s AND expires_at > clock_timestamp();

-- name: hold_end
SELECT agentlease_end_hold(%(name)s::text, %(token)s::text, %(commit)s::boolean);

-- name: hold_settle
SELECT agentlease_settle_hold(%(name)s::text, %(token)s::text, %(units)s::bigint);

-- name: retry_budget
SELECT calls, retries, granted
FROM agentlease_retry_budget(
    %(key)s::text, %(calls)s::bigint, %(retry)s::boolean, %(ratio)s::float8,
    %(minimum)s::bigint, %(ttl)s::float8
);

-- name: breaker_admit
SELECT state, failures, fence, retry_after, trial
FROM agentlease_breaker_admit(%(key)s::text, %(trial_for)s::float8, %(ttl)s::float8);

-- name: breaker_record
SELECT state, failures, fence, retry_after, trial
FROM agentlease_breaker_record(
    %(key)s::text, %(fence)s::bigint, %(ok)s::boolean, %(threshold)s::bigint,
    %(cooldown)s::float8, %(ttl)s::float8
);

-- name: secret
-- The store's secret %(name)s, made from %(candidate)s by the first call (0012_plans.sql).
SELECT agentlease_secret(%(name)s::text, %(candidate)s::bytea);

-- name: plan_act
-- One call of agentlease_act_plan() (postgres_migrations/0012_plans.sql): a plan checked and
-- acted on, or refused, in one transaction.
SELECT outcome, approved_by, approved_at, versions, stale_kinds, stale_keys, stale_read,
       stale_now, at_write, version, fence, updated_at, fields, vals, value, detail
FROM agentlease_act_plan(
    %(id)s::text, %(approved_by)s::text, %(keep_for)s::float8, %(not_after)s::float8,
    %(read_kinds)s::text[], %(read_keys)s::text[], %(read_versions)s::bigint[],
    %(pins)s::jsonb, %(write_kinds)s::text[], %(write_keys)s::text[],
    %(replace)s::boolean[], %(expected)s::bigint[], %(guard)s::text[],
    %(allow_absent)s::boolean[], %(fence)s::bigint[], %(field_of)s::integer[],
    %(field_names)s::text[], %(field_values)s::bytea[], %(allowed_of)s::integer[],
    %(allowed_values)s::bytea[], %(delta)s::bigint[], %(low)s::bigint[], %(high)s::bigint[]
);

-- name: locks_acquire
SELECT name, fence, holder, retry_after
FROM agentlease_acquire_locks(%(names)s::text[], %(owner)s::text, %(ttl)s::float8);

-- name: lock_take
-- A set of one lock: take it for %(owner)s if it is free (no owner, the owner itself, or its
-- lease ran out), fence + 1 (a new lock starts at 1), in one statement: it locks one row, so it
-- waits for no other and needs no order. Returns nothing when another owner holds it (then
-- locks_acquire says who). The clock is read after any wait for the row lock.
INSERT INTO agentlease_locks AS l (name, owner, expires_at, fence)
VALUES (%(name)s, %(owner)s, clock_timestamp() + make_interval(secs => %(ttl)s::float8), 1)
ON CONFLICT ON CONSTRAINT agentlease_locks_pkey DO UPDATE
SET owner = excluded.owner,
    expires_at = clock_timestamp() + make_interval(secs => %(ttl)s::float8),
    fence = l.fence + 1
WHERE l.owner IS NULL OR l.owner = excluded.owner OR l.expires_at <= clock_timestamp()
RETURNING l.fence;

-- name: lock_release
-- A set of one lock: release it if %(owner)s holds it with a live lease (one row: no order).
UPDATE agentlease_locks l SET owner = NULL, expires_at = NULL
WHERE l.name = %(name)s AND l.owner = %(owner)s AND l.expires_at > clock_timestamp()
RETURNING l.name;

-- name: locks_extend
SELECT name FROM agentlease_extend_locks(%(names)s::text[], %(owner)s::text, %(ttl)s::float8);

-- name: locks_release
SELECT name FROM agentlease_release_locks(%(names)s::text[], %(owner)s::text);

-- name: locks_holders
SELECT l.name, l.owner, extract(epoch FROM l.expires_at)::float8
FROM agentlease_locks l
WHERE l.name = ANY (%(names)s::text[]) AND l.owner IS NOT NULL
  AND l.expires_at > (SELECT clock_timestamp());

-- name: locks_sweep
-- Soonest expiry first through the partial index on expires_at, bounded by the clock read once.
-- Rows another transaction holds (an acquire or a release right now) are skipped; the rows
-- picked stay locked until the UPDATE, which finds them by primary key.
WITH doomed AS MATERIALIZED (
    SELECT l.name FROM agentlease_locks l
    WHERE l.owner IS NOT NULL AND l.expires_at <= (SELECT clock_timestamp())
    ORDER BY l.expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE agentlease_locks l SET owner = NULL, expires_at = NULL
WHERE l.name = ANY (ARRAY(SELECT d.name FROM doomed d));

-- name: migrations_exist
-- Whether the schema has agentlease's tables; and whether it exists but the role may not use it
-- (no USAGE: the search path leaves it out, so its tables look absent).
SELECT to_regclass('agentlease_migrations') IS NOT NULL,
       EXISTS (SELECT 1 FROM pg_namespace
               WHERE nspname = %(schema)s AND NOT has_schema_privilege(oid, 'USAGE'));

-- name: applied_versions
SELECT version FROM agentlease_migrations ORDER BY version;

-- name: migration_lock
-- Held until the migrating transaction ends: processes starting at once migrate one at a time.
SELECT pg_advisory_xact_lock(%(key)s::bigint);

-- name: schema_exists
SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %(schema)s);

-- name: migrations_table
CREATE TABLE IF NOT EXISTS agentlease_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- name: record_migration
INSERT INTO agentlease_migrations (version, name) VALUES (%(version)s, %(name)s);
