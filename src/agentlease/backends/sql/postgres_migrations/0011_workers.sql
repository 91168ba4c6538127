-- Live workers, the holder of each lease, and each task's attempt history.
--
-- 1. agentlease_tasks.holder: the worker that claimed the live lease (NULL for a claim that
--    named none, and for the tasks already there).
-- 2. agentlease_attempts: one row per attempt of a task that ended otherwise than done (fail,
--    release, a reap, a cancel), the last 20 kept, written by the trigger
--    agentlease_attempt_close inside the statement that ended it, so each of those primitives
--    stays one atomic step whatever function or statement runs it; a deleted task's attempts go
--    with it (trigger agentlease_attempt_forget).
-- 3. agentlease_workers: one row per live worker, with a TTL (expires_at) on the store's clock.
-- 4. agentlease_claim_holder: agentlease_claim_context (0008_task_context.sql) that writes the
--    claim's holder into each leased row and returns each job's due time (run_at, which a claim
--    does not change; the queue latency metric reads it).

ALTER TABLE agentlease_tasks ADD COLUMN holder text;

CREATE TABLE agentlease_attempts (
    task_id text NOT NULL,
    attempt integer NOT NULL,
    worker  text,
    started timestamptz NOT NULL,
    ended   timestamptz,
    outcome text,
    error   text,
    PRIMARY KEY (task_id, attempt)
);

CREATE TABLE agentlease_workers (
    id         text PRIMARY KEY,
    info       json NOT NULL,
    beat_at    timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX agentlease_workers_expiry ON agentlease_workers (expires_at);

-- A lease ended otherwise than done: record its attempt, with the holder the claim wrote and
-- its leased_at, the outcome told by what the statement changed: a failure (failures + 1, with
-- the error's type); a reap (reclaims + 1): expired; back to queued otherwise: released; else
-- the new state (dead past max_reclaims counts as expired; cancelled passes through). Attempts
-- past the last 20 are dropped (through the primary key). A claim and a completion record
-- nothing: the running attempt and the last one of a done task are read from the task's row
-- (holder, leased_at, finished_at), so the path nearly every task takes writes no more rows.
CREATE FUNCTION agentlease_attempt_close() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO agentlease_attempts (task_id, attempt, worker, started, ended, outcome, error)
    VALUES (
        NEW.id, OLD.attempt, OLD.holder, OLD.leased_at,
        greatest(clock_timestamp(), OLD.leased_at),
        CASE WHEN NEW.failures > OLD.failures THEN 'failed'
             WHEN NEW.reclaims > OLD.reclaims THEN 'expired'
             WHEN NEW.state = 'queued' THEN 'released'
             ELSE NEW.state END,
        CASE WHEN NEW.failures > OLD.failures AND json_typeof(NEW.error) = 'object'
             THEN NEW.error ->> 'type' END
    )
    ON CONFLICT (task_id, attempt) DO UPDATE
    SET worker = EXCLUDED.worker, started = EXCLUDED.started, ended = EXCLUDED.ended,
        outcome = EXCLUDED.outcome, error = EXCLUDED.error;
    IF OLD.attempt > 20 THEN
        DELETE FROM agentlease_attempts WHERE task_id = NEW.id AND attempt <= OLD.attempt - 20;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER agentlease_attempt_close
AFTER UPDATE OF state ON agentlease_tasks
FOR EACH ROW WHEN (OLD.state = 'leased' AND NEW.state NOT IN ('leased', 'done'))
EXECUTE FUNCTION agentlease_attempt_close();

-- A task deleted (delete_queue, a purge) takes its attempt history with it, in the same
-- statement.
CREATE FUNCTION agentlease_attempt_forget() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM agentlease_attempts WHERE task_id = OLD.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER agentlease_attempt_forget
AFTER DELETE ON agentlease_tasks
FOR EACH ROW
EXECUTE FUNCTION agentlease_attempt_forget();

-- Lease up to p_n ready tasks of p_queue, as agentlease_claim_context does, each lease held by
-- p_holder (NULL: none named).
CREATE FUNCTION agentlease_claim_holder(
    p_queue text,
    p_n integer,
    p_lease_for double precision,
    p_max_total double precision,
    p_progress_timeout double precision,
    p_front boolean,
    p_holder text
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
    context json,
    run_at double precision
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
               NULL::bigint, NULL::json, NULL::float8
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
        progressed_at = v_now,
        holder = p_holder
    FROM unnest(v_ids) WITH ORDINALITY AS p(id, rank)
    WHERE t.id = p.id
    RETURNING t.id, NULL::text, t.token, t.attempt, t.payload, t.checkpoint, t.priority,
              t.failures, t.reclaims, v_now_s, v_expires_s, p.rank, t.context,
              extract(epoch FROM t.run_at)::float8;
END
$$;
