-- agentlease on PostgreSQL, schema version 1: the tables, their partial indexes, and the two
-- functions that make a claim one atomic step.
--
-- Applied by `agentlease migrate` (or on first use) in one transaction that holds an advisory lock
-- for the schema, with search_path set to that schema, so every name below lands there. Applied
-- versions are recorded in agentlease_migrations; a file is never edited once released: changes go
-- in a new file with the next number. Needs PostgreSQL 13 or later (gen_random_uuid).
--
-- Times are timestamptz read from clock_timestamp(): the store's clock decides every lease.

CREATE TABLE agentlease_queues (
    name       text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Orders tasks of one priority (FIFO). Tasks sent to the front subtract 2^62 (see
-- agentlease_front), which keeps their relative order and puts them before every other task.
CREATE SEQUENCE agentlease_seq AS bigint;

CREATE TABLE agentlease_tasks (
    id               text PRIMARY KEY,
    queue            text NOT NULL,
    state            text NOT NULL CONSTRAINT agentlease_tasks_state
        CHECK (state IN ('scheduled', 'queued', 'leased', 'failed', 'done', 'dead')),
    priority         integer NOT NULL,
    seq              bigint NOT NULL,
    payload          json NOT NULL,
    dedup_key        text,
    attempt          integer NOT NULL DEFAULT 0,   -- the fencing number: +1 at every claim
    reclaims         integer NOT NULL DEFAULT 0,   -- leases that expired
    failures         integer NOT NULL DEFAULT 0,   -- errors the handler raised
    max_reclaims     integer NOT NULL,
    created_at       timestamptz NOT NULL,
    run_at           timestamptz NOT NULL,
    token            text,                         -- the live lease's random token
    leased_at        timestamptz,
    expires_at       timestamptz,
    lease_deadline   timestamptz,                  -- leased_at + max_lease: extends stop there
    progress_timeout interval,
    progressed_at    timestamptz,
    finished_at      timestamptz,
    progress         json,
    checkpoint       json,
    result           json,
    error            json,
    -- A token exists exactly while the task is leased, so "token = $token" alone says "leased":
    -- holder writes then match on the primary key only, and no plan can prefer another index.
    CONSTRAINT agentlease_tasks_token CHECK ((token IS NOT NULL) = (state = 'leased'))
);

-- Partial indexes: claim, promotion and reaping read only live rows, so their cost does not grow
-- with the number of finished tasks. The done index serves stats and retention.
CREATE INDEX agentlease_tasks_ready ON agentlease_tasks (queue, priority DESC, seq)
    WHERE state = 'queued';
CREATE INDEX agentlease_tasks_waiting ON agentlease_tasks (queue, run_at)
    WHERE state IN ('scheduled', 'failed');
CREATE INDEX agentlease_tasks_leased ON agentlease_tasks (queue, expires_at)
    WHERE state = 'leased';
CREATE INDEX agentlease_tasks_dead ON agentlease_tasks (queue, finished_at)
    WHERE state = 'dead';
CREATE INDEX agentlease_tasks_done ON agentlease_tasks (queue, finished_at)
    WHERE state = 'done';
CREATE UNIQUE INDEX agentlease_tasks_dedup ON agentlease_tasks (queue, dedup_key)
    WHERE dedup_key IS NOT NULL;

-- The sequence number that puts a task ahead of every task not yet sent to the front
-- (agentlease._policy.lease.front_seq).
CREATE FUNCTION agentlease_front(seq bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT CASE WHEN seq >= 0 THEN seq - 4611686018427387904 ELSE seq END $$;

-- Requeue (or dead-letter, past max_reclaims) every lease of the queue that expired by p_now.
-- Rows another transaction holds (a holder completing right now, another reaper) are skipped:
-- whoever holds the row lock decides, and the loser re-checks and sees the row has moved on.
-- plpgsql rather than sql: its plans are cached per session, a sql function's are not; and
-- generic index-scan plans, like agentlease_claim's (see there).
CREATE FUNCTION agentlease_reap(p_queue text, p_front boolean, p_now timestamptz)
RETURNS TABLE (task_id text, attempt integer, outcome text)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH expired AS MATERIALIZED (
        SELECT x.id FROM agentlease_tasks x
        WHERE x.queue = p_queue AND x.state = 'leased' AND x.expires_at <= p_now
        ORDER BY x.expires_at, x.id
        FOR UPDATE SKIP LOCKED
    ), reaped AS (
        -- id = ANY(ARRAY(...)): a primary-key lookup per row, whatever the generic plan guesses.
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
        WHERE t.id = ANY (ARRAY(SELECT e.id FROM expired e))
        RETURNING t.id, t.attempt, t.state
    )
    SELECT r.id, r.attempt, CASE WHEN r.state = 'dead' THEN 'dead' ELSE 'requeued' END
    FROM reaped r;
END
$$;

-- The claim: one call, one transaction, three statements that each see the one before.
--   1. promote the queue's scheduled and failed tasks whose run_at has come;
--   2. reap its expired leases (front or back; dead-letter past max_reclaims);
--   3. lease up to p_n ready tasks by (priority DESC, seq): a MATERIALIZED CTE picks the ids with
--      FOR UPDATE SKIP LOCKED and LIMIT, then one UPDATE ... RETURNING marks them leased with a
--      fresh random token, attempt + 1 and an expiry from the store's clock.
-- Because 3 sees 1 and 2, a task reaped by this claim can be leased by this same claim, first in
-- its priority (it goes to the front). Returns the reaped leases (reaped = 'requeued' or 'dead')
-- and then the jobs (reaped IS NULL) in pick order.
CREATE FUNCTION agentlease_claim(
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
    expires_at double precision
)
LANGUAGE plpgsql VOLATILE
-- Every statement here has one good plan, whatever the values and the table's size: an index
-- scan (a partial index by queue, or the primary key). Left to choose, PostgreSQL re-plans each
-- call (custom plans cost more than the claim itself), or keeps a generic plan made when the
-- table was empty (a sequential scan, for ever). So: generic plans, and index scans only.
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz := clock_timestamp();
    v_deadline timestamptz := v_now + make_interval(secs => p_max_total);
    v_timeout  interval := make_interval(secs => p_progress_timeout);
    v_expires  timestamptz := least(
        v_now + make_interval(secs => p_lease_for), v_deadline, v_now + v_timeout
    );
    v_due      boolean;
    v_expired  boolean;
BEGIN
    -- One cheap probe first: most claims find nothing to promote and nothing to reap, and an
    -- index probe costs less than starting an UPDATE that changes nothing.
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
               NULL::integer, NULL::integer, NULL::integer, NULL::float8, NULL::float8
        FROM agentlease_reap(p_queue, p_front, v_now) r;
    END IF;

    RETURN QUERY
    WITH picked AS MATERIALIZED (
        SELECT c.id FROM agentlease_tasks c
        WHERE c.queue = p_queue AND c.state = 'queued'
        ORDER BY c.priority DESC, c.seq
        LIMIT p_n
        FOR UPDATE SKIP LOCKED
    ), leased AS (
        UPDATE agentlease_tasks t
        SET state = 'leased',
            token = replace(gen_random_uuid()::text, '-', ''),
            attempt = t.attempt + 1,
            leased_at = v_now,
            expires_at = v_expires,
            lease_deadline = v_deadline,
            progress_timeout = v_timeout,
            progressed_at = v_now
        WHERE t.id = ANY (ARRAY(SELECT p.id FROM picked p))
        RETURNING t.id, t.token, t.attempt, t.payload, t.checkpoint, t.priority, t.failures,
                  t.reclaims, t.seq
    )
    SELECT l.id, NULL::text, l.token, l.attempt, l.payload, l.checkpoint, l.priority, l.failures,
           l.reclaims, extract(epoch FROM v_now)::float8, extract(epoch FROM v_expires)::float8
    FROM leased l
    ORDER BY l.priority DESC, l.seq;
END
$$;

-- Extend many leases in one call: one statement, one transaction, one clock reading for all.
-- The rows are found by "id = ANY(p_ids)", a primary-key scan whatever the planner believes
-- about the table (a join planned on stale statistics could scan every lease once per lease);
-- each row's token is then checked against the tokens the caller gave for that id (usually
-- one; a zombie and the live holder may both be in one call). Rows are locked in primary-key
-- order, so two callers that share leases cannot deadlock. The new expiry is
-- agentlease._policy.lease.lease_expiry.
CREATE FUNCTION agentlease_extend(p_ids text[], p_tokens text[], p_lease_for double precision)
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

    RETURN QUERY
    UPDATE agentlease_tasks t
    SET expires_at = least(
        v_now + make_interval(secs => p_lease_for), t.lease_deadline,
        t.progressed_at + t.progress_timeout
    )
    WHERE t.id = ANY (p_ids) AND (v_tokens -> t.id) ? t.token AND t.expires_at > v_now
    RETURNING t.id, t.token, extract(epoch FROM t.expires_at)::float8;
END
$$;
