-- agentlease on PostgreSQL, schema version 6: the same guarantees for less work per call.
--
-- Applied like 0001_initial.sql: in one transaction under the schema's advisory lock, with
-- search_path set to that schema. Times are timestamptz read from clock_timestamp(), after any
-- wait for a row lock. No table changes.
--
-- 1. agentlease_claim_ranked: agentlease_claim (0001_initial.sql), returning each job with its
--    rank in pick order instead of sorting the jobs: the client puts them in that order. A sort
--    copies every row it sorts, payloads included, and that was a sixth of a claim's time.
--    agentlease_claim stays as it was, for clients of schema version 5 still running.
-- 2. agentlease_write_record (0003_state.sql), same signature and outcome: a write with no
--    transition guard and an expected version other than 0 first tries one UPDATE that checks the
--    version and the fence in its WHERE (the row lock it takes serialises writers as FOR UPDATE
--    did; a version that moved while it waited fails the check); only a write that UPDATE did
--    not apply takes the locked read and decides as before. A replacing write that succeeds
--    returns the fields it wrote (the record's fields, exactly) instead of reading them back.
-- 3. agentlease_reserve_key (0002_keys.sql), same signature and outcome: the reservation's token
--    is drawn only by a call that goes on to write, not by one that answers from its first read
--    (a replay, a live duplicate, a conflict).

-- Lease up to p_n ready tasks of p_queue, as agentlease_claim does (promote due tasks, reap
-- expired leases, then lease by (priority DESC, seq) with FOR UPDATE SKIP LOCKED), in one
-- transaction. The ids are picked (and their rows locked) first, then one UPDATE leases them,
-- joined to the picked ids WITH ORDINALITY: each row by primary key (a nested loop, the only join
-- allowed here), each job with its rank, 1 for the first picked.
-- Returns the reaped leases (reaped = 'requeued' or 'dead', rank NULL) and the jobs (reaped
-- NULL), in no particular order.
CREATE FUNCTION agentlease_claim_ranked(
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
    rank bigint
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
               NULL::bigint
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
              t.failures, t.reclaims, v_now_s, v_expires_s, p.rank;
END
$$;

-- One guarded write of a record: see 0003_state.sql for the checks and the outcome, and the
-- header of this file for the first UPDATE.
CREATE OR REPLACE FUNCTION agentlease_write_record(
    p_key text,
    p_fields text[],
    p_values bytea[],
    p_replace boolean,
    p_expected bigint,
    p_guard text,
    p_allowed bytea[],
    p_allow_absent boolean,
    p_fence bigint
)
RETURNS TABLE (
    outcome text,
    version bigint,
    fence bigint,
    updated_at double precision,
    fields text[],
    vals bytea[]
)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz;
    v_row     agentlease_records;
    v_found   boolean := false;
    v_state   bytea;
    v_has     boolean := false;
    v_outcome text;
BEGIN
    -- No guard field to read under the lock, and a record expected to exist: one UPDATE decides
    -- (it waits for the row lock and checks the row as it is then).
    IF p_guard IS NULL AND p_expected IS DISTINCT FROM 0 THEN
        UPDATE agentlease_records r
        SET version = r.version + 1,
            fence = greatest(r.fence, coalesce(p_fence, 0)),
            updated_at = clock_timestamp()
        WHERE r.key = p_key
          AND (p_expected IS NULL OR r.version = p_expected)
          AND (p_fence IS NULL OR r.fence <= p_fence)
        RETURNING r.* INTO v_row;
        v_found := FOUND;
        IF v_found THEN
            v_outcome := 'ok';
        END IF;
    END IF;

    WHILE v_outcome IS NULL LOOP
        SELECT r.* INTO v_row FROM agentlease_records r WHERE r.key = p_key FOR UPDATE;
        v_found := FOUND;
        v_now := clock_timestamp();  -- after any wait for the row lock
        IF p_guard IS NOT NULL THEN
            SELECT f.value INTO v_state FROM agentlease_record_fields f
            WHERE f.key = p_key AND f.field = p_guard;
            v_has := FOUND;
        END IF;
        v_outcome := CASE
            WHEN p_fence IS NOT NULL AND p_fence < coalesce(v_row.fence, 0) THEN 'fenced'
            WHEN p_expected IS NOT NULL AND p_expected <> coalesce(v_row.version, 0)
                THEN 'conflict'
            WHEN p_guard IS NOT NULL AND NOT CASE
                WHEN v_has THEN coalesce(v_state = ANY (p_allowed), false)
                ELSE p_allow_absent
            END THEN 'transition'
            ELSE 'ok'
        END;
        IF v_outcome <> 'ok' THEN
            EXIT;
        END IF;
        IF v_found THEN
            UPDATE agentlease_records r
            SET version = r.version + 1,
                fence = greatest(r.fence, coalesce(p_fence, 0)),
                updated_at = v_now
            WHERE r.key = p_key
            RETURNING r.* INTO v_row;
        ELSE
            INSERT INTO agentlease_records AS r (key, version, fence, updated_at)
            VALUES (p_key, 1, greatest(coalesce(p_fence, 0), 0), v_now)
            ON CONFLICT ON CONSTRAINT agentlease_records_pkey DO NOTHING
            RETURNING r.* INTO v_row;
            IF NOT FOUND THEN
                v_outcome := NULL;  -- created meanwhile: decide again on what it holds
                CONTINUE;
            END IF;
            v_found := true;
        END IF;
    END LOOP;

    IF v_outcome <> 'ok' THEN
        IF NOT v_found THEN
            RETURN QUERY SELECT v_outcome, NULL::bigint, NULL::bigint, NULL::float8,
                                NULL::text[], NULL::bytea[];
            RETURN;
        END IF;
    ELSE
        IF p_replace THEN
            DELETE FROM agentlease_record_fields f
            WHERE f.key = p_key AND f.field <> ALL (p_fields);
        END IF;
        INSERT INTO agentlease_record_fields AS f (key, field, value)
        SELECT p_key, u.field, u.value FROM unnest(p_fields, p_values) AS u(field, value)
        ON CONFLICT ON CONSTRAINT agentlease_record_fields_pkey
        DO UPDATE SET value = excluded.value;
        IF p_replace THEN
            RETURN QUERY SELECT v_outcome, v_row.version, v_row.fence,
                                extract(epoch FROM v_row.updated_at)::float8, p_fields, p_values;
            RETURN;
        END IF;
    END IF;
    -- The row lock is still held: this reads the record as decided (or as written).
    RETURN QUERY
    SELECT v_outcome, r.version, r.fence, extract(epoch FROM r.updated_at)::float8,
           array(SELECT f.field FROM agentlease_record_fields f
                 WHERE f.key = p_key ORDER BY f.field),
           array(SELECT f.value FROM agentlease_record_fields f
                 WHERE f.key = p_key ORDER BY f.field)
    FROM agentlease_records r WHERE r.key = p_key;
END
$$;

-- Reserve p_key for one attempt, or say why not: see 0002_keys.sql, and 3. above.
CREATE OR REPLACE FUNCTION agentlease_reserve_key(
    p_key text,
    p_fingerprint text,
    p_holder text,
    p_hold_for double precision,
    p_window double precision
)
RETURNS TABLE (
    reserved text,
    taken_over boolean,
    key text,
    state text,
    fingerprint text,
    fence bigint,
    holder text,
    expires_at double precision,
    result bytea,
    error bytea,
    created_at double precision,
    finished_at double precision,
    purge_at double precision,
    now double precision
)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_hold   interval := make_interval(secs => p_hold_for);
    v_window interval := make_interval(secs => p_window);
    v_token  text;
    v_now    timestamptz;
    v_row    agentlease_keys;
    v_won    boolean := false;
    v_taken  boolean := false;
BEGIN
    -- A replay, a live duplicate or a conflict writes nothing: answer it from a plain read, with
    -- no row lock (a lock would give the call a transaction id and a WAL flush at commit). Only a
    -- call that may write goes on to the locked path below, which decides again.
    v_now := clock_timestamp();
    SELECT k.* INTO v_row FROM agentlease_keys k WHERE k.key = p_key;
    IF FOUND AND v_row.purge_at > v_now
       AND NOT (v_row.state = 'in_flight' AND v_row.expires_at <= v_now
                AND (v_row.fingerprint = p_fingerprint OR v_row.token IS NULL)) THEN
        RETURN QUERY SELECT
            NULL::text, false, v_row.key, v_row.state, v_row.fingerprint, v_row.fence,
            v_row.holder, extract(epoch FROM v_row.expires_at)::float8, v_row.result,
            v_row.error, extract(epoch FROM v_row.created_at)::float8,
            extract(epoch FROM v_row.finished_at)::float8,
            extract(epoch FROM v_row.purge_at)::float8, extract(epoch FROM v_now)::float8;
        RETURN;
    END IF;

    v_token := replace(gen_random_uuid()::text, '-', '');
    LOOP
        v_now := clock_timestamp();
        INSERT INTO agentlease_keys AS k
            (key, state, fingerprint, token, fence, holder, expires_at, created_at, purge_at)
        VALUES
            (p_key, 'in_flight', p_fingerprint, v_token, 1, p_holder, v_now + v_hold, v_now,
             v_now + v_hold + v_window)
        ON CONFLICT ON CONSTRAINT agentlease_keys_pkey DO NOTHING
        RETURNING k.* INTO v_row;
        IF FOUND THEN
            v_won := true;
            EXIT;
        END IF;

        SELECT k.* INTO v_row FROM agentlease_keys k WHERE k.key = p_key FOR UPDATE;
        IF FOUND THEN
            v_now := clock_timestamp();  -- after any wait for the row lock
            IF v_row.purge_at <= v_now
               OR (v_row.state = 'in_flight' AND v_row.expires_at <= v_now
                   AND (v_row.fingerprint = p_fingerprint OR v_row.token IS NULL)) THEN
                v_won := true;
                v_taken := v_row.purge_at > v_now;
                UPDATE agentlease_keys k
                SET state = 'in_flight',
                    fingerprint = p_fingerprint,
                    token = v_token,
                    fence = k.fence + 1,
                    holder = p_holder,
                    expires_at = v_now + v_hold,
                    result = NULL,
                    error = NULL,
                    created_at = CASE WHEN v_taken THEN k.created_at ELSE v_now END,
                    finished_at = NULL,
                    purge_at = v_now + v_hold + v_window
                WHERE k.key = p_key
                RETURNING k.* INTO v_row;
            END IF;
            EXIT;
        END IF;
    END LOOP;

    RETURN QUERY SELECT
        CASE WHEN v_won THEN v_token END, v_taken, v_row.key, v_row.state, v_row.fingerprint,
        v_row.fence, v_row.holder, extract(epoch FROM v_row.expires_at)::float8, v_row.result,
        v_row.error, extract(epoch FROM v_row.created_at)::float8,
        extract(epoch FROM v_row.finished_at)::float8, extract(epoch FROM v_row.purge_at)::float8,
        extract(epoch FROM v_now)::float8;
END
$$;
