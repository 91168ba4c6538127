-- agentlease on PostgreSQL, schema version 3: shared-state guards. Versioned records, bounded
-- counters and lock sets, and the functions that make each guarded write one call.
--
-- Applied like 0001_initial.sql: in one transaction under the schema's advisory lock, with
-- search_path set to that schema. Times are timestamptz read from clock_timestamp(), after any
-- wait for a row lock.

-- A versioned record: one row here (its version, the highest fencing token it has seen) and one
-- row per field in agentlease_record_fields. Every write of a record locks this row first, so the
-- row lock serialises all writes of one record, and writers of different fields never lose each
-- other's writes. Records are never deleted.
CREATE TABLE agentlease_records (
    key        text PRIMARY KEY,
    version    bigint NOT NULL,
    fence      bigint NOT NULL,
    updated_at timestamptz NOT NULL
);

-- A field's value is bytea: the JSON bytes the client encoded, kept and returned as they are, so
-- a transition guard compares exactly the bytes it was given.
CREATE TABLE agentlease_record_fields (
    key   text NOT NULL,
    field text NOT NULL,
    value bytea NOT NULL,
    PRIMARY KEY (key, field)
);

CREATE TABLE agentlease_counters (
    name  text PRIMARY KEY,
    value bigint NOT NULL
);

-- A lock is held while it has an owner and expires_at > now: an expired lock is free whether or
-- not a sweep has cleared it. Rows are never deleted, so a lock's fence only rises. The partial
-- index lets a sweep visit held locks by expiry, never free ones.
CREATE TABLE agentlease_locks (
    name       text PRIMARY KEY,
    owner      text,
    expires_at timestamptz,
    fence      bigint NOT NULL,
    CONSTRAINT agentlease_locks_owner CHECK ((owner IS NULL) = (expires_at IS NULL))
);
CREATE INDEX agentlease_locks_expiry ON agentlease_locks (expires_at) WHERE owner IS NOT NULL;

-- One guarded write of a record (agentlease._records.RecordWrite): one call, one transaction.
-- Lock the record's row (FOR UPDATE), read the clock, then check against what it holds now, in
-- this order: p_fence below the record's fence (fenced), p_expected other than its version
-- (conflict; an absent record has version 0), the guard field's stored bytes not among
-- p_allowed (p_allow_absent: it may be absent) (transition). A refusal changes nothing. An
-- absent record is inserted (ON CONFLICT DO NOTHING: when a concurrent writer created it
-- first, decide again under its row lock). Then the fields are written (p_replace: the others
-- are dropped), version + 1, fence = the higher of the two.
-- Returns one row: the outcome ('ok', 'fenced', 'conflict' or 'transition') and the record as
-- it is after the call (times as epoch seconds, fields as two aligned arrays), or NULLs after
-- the outcome when a refused record does not exist.
CREATE FUNCTION agentlease_write_record(
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
    v_found   boolean;
    v_state   bytea;
    v_has     boolean := false;
    v_outcome text;
BEGIN
    LOOP
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
            WHERE r.key = p_key;
        ELSE
            INSERT INTO agentlease_records AS r (key, version, fence, updated_at)
            VALUES (p_key, 1, greatest(coalesce(p_fence, 0), 0), v_now)
            ON CONFLICT ON CONSTRAINT agentlease_records_pkey DO NOTHING;
            CONTINUE WHEN NOT FOUND;  -- created meanwhile: decide again on what it holds
        END IF;
        IF p_replace THEN
            DELETE FROM agentlease_record_fields f
            WHERE f.key = p_key AND f.field <> ALL (p_fields);
        END IF;
        INSERT INTO agentlease_record_fields AS f (key, field, value)
        SELECT p_key, u.field, u.value FROM unnest(p_fields, p_values) AS u(field, value)
        ON CONFLICT ON CONSTRAINT agentlease_record_fields_pkey
        DO UPDATE SET value = excluded.value;
        EXIT;
    END LOOP;

    IF v_outcome <> 'ok' AND NOT v_found THEN
        RETURN QUERY SELECT v_outcome, NULL::bigint, NULL::bigint, NULL::float8, NULL::text[],
                            NULL::bytea[];
        RETURN;
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

-- Add p_delta to a counter (absent: 0) unless the result leaves [p_low, p_high] (NULL: no
-- bound): one call, one transaction. The common case is one UPDATE. When it matches nothing (the
-- counter is absent, or the result would leave the range) the row is locked and read, and the
-- call decides on that value; an absent counter is inserted (ON CONFLICT DO NOTHING: when a
-- concurrent call created it first, try again).
-- Returns one row: whether it was added, and the counter's value (the new one, or the one that
-- refused it).
CREATE FUNCTION agentlease_add_counter(p_name text, p_delta bigint, p_low bigint, p_high bigint)
RETURNS TABLE (added boolean, value bigint)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_value bigint;
BEGIN
    LOOP
        UPDATE agentlease_counters c SET value = c.value + p_delta
        WHERE c.name = p_name
          AND (p_low IS NULL OR c.value + p_delta >= p_low)
          AND (p_high IS NULL OR c.value + p_delta <= p_high)
        RETURNING c.value INTO v_value;
        IF FOUND THEN
            RETURN QUERY SELECT true, v_value;
            RETURN;
        END IF;

        SELECT c.value INTO v_value FROM agentlease_counters c WHERE c.name = p_name FOR UPDATE;
        IF FOUND THEN
            IF (p_low IS NOT NULL AND v_value + p_delta < p_low)
               OR (p_high IS NOT NULL AND v_value + p_delta > p_high) THEN
                RETURN QUERY SELECT false, v_value;
                RETURN;
            END IF;
            CONTINUE;  -- it moved into range since the UPDATE looked: the row is locked now
        END IF;

        IF (p_low IS NOT NULL AND p_delta < p_low) OR (p_high IS NOT NULL AND p_delta > p_high) THEN
            RETURN QUERY SELECT false, 0::bigint;
            RETURN;
        END IF;
        INSERT INTO agentlease_counters AS c (name, value) VALUES (p_name, p_delta)
        ON CONFLICT ON CONSTRAINT agentlease_counters_pkey DO NOTHING
        RETURNING c.value INTO v_value;
        IF FOUND THEN
            RETURN QUERY SELECT true, v_value;
            RETURN;
        END IF;
    END LOOP;
END
$$;

-- Acquire every lock of p_names for p_owner, or none: one call, one transaction.
--   1. insert the missing lock rows (free, fence 0), ON CONFLICT DO NOTHING;
--   2. lock every row of the set (FOR UPDATE), in name order;
--   3. read the clock; if a lock is held by another owner with a live lease, return the first
--      one in the order of p_names and change nothing (the rows step 1 inserted are free locks
--      at fence 0: the same as absent);
--   4. else take them all: owner, expiry now + p_ttl, fence + 1.
-- Every call that waits for lock rows (this one, agentlease_extend_locks,
-- agentlease_release_locks) inserts and locks them in one order, name COLLATE "C" (the code
-- point order the client sorts by), so calls with overlapping sets queue and never deadlock.
-- Returns the taken locks (name, fence), or one row (name, NULL, holder, retry_after).
CREATE FUNCTION agentlease_acquire_locks(p_names text[], p_owner text, p_ttl double precision)
RETURNS TABLE (name text, fence bigint, holder text, retry_after double precision)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_now  timestamptz;
    v_busy agentlease_locks;
BEGIN
    INSERT INTO agentlease_locks AS l (name, owner, expires_at, fence)
    SELECT n.name, NULL, NULL, 0 FROM unnest(p_names) AS n(name) ORDER BY n.name COLLATE "C"
    ON CONFLICT ON CONSTRAINT agentlease_locks_pkey DO NOTHING;

    PERFORM 1 FROM (
        SELECT l.name FROM agentlease_locks l
        WHERE l.name = ANY (p_names)
        ORDER BY l.name COLLATE "C"
        FOR UPDATE
    ) x;
    v_now := clock_timestamp();  -- after any wait for the row locks

    SELECT l.* INTO v_busy FROM agentlease_locks l
    WHERE l.name = ANY (p_names) AND l.owner IS NOT NULL AND l.owner <> p_owner
      AND l.expires_at > v_now
    ORDER BY array_position(p_names, l.name)
    LIMIT 1;
    IF FOUND THEN
        RETURN QUERY SELECT v_busy.name, NULL::bigint, v_busy.owner,
                            extract(epoch FROM v_busy.expires_at - v_now)::float8;
        RETURN;
    END IF;

    RETURN QUERY
    UPDATE agentlease_locks l
    SET owner = p_owner, expires_at = v_now + make_interval(secs => p_ttl), fence = l.fence + 1
    WHERE l.name = ANY (p_names)
    RETURNING l.name, l.fence, NULL::text, NULL::float8;
END
$$;

-- Renew the locks of p_names that p_owner holds with a live lease to now + p_ttl: one call.
-- Locks p_owner's rows in name order (see agentlease_acquire_locks), then reads the clock.
-- Returns the names renewed.
CREATE FUNCTION agentlease_extend_locks(p_names text[], p_owner text, p_ttl double precision)
RETURNS TABLE (name text)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz;
    v_locked text[];
BEGIN
    SELECT array_agg(x.name) INTO v_locked FROM (
        SELECT l.name FROM agentlease_locks l
        WHERE l.name = ANY (p_names) AND l.owner = p_owner
        ORDER BY l.name COLLATE "C"
        FOR UPDATE
    ) x;
    v_now := clock_timestamp();  -- after any wait for the row locks

    RETURN QUERY
    UPDATE agentlease_locks l SET expires_at = v_now + make_interval(secs => p_ttl)
    WHERE l.name = ANY (v_locked) AND l.owner = p_owner AND l.expires_at > v_now
    RETURNING l.name;
END
$$;

-- Release the locks of p_names that p_owner holds with a live lease: one call. Locks p_owner's
-- rows in name order (see agentlease_acquire_locks), then reads the clock. The fence is kept.
-- Returns the names released.
CREATE FUNCTION agentlease_release_locks(p_names text[], p_owner text)
RETURNS TABLE (name text)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz;
    v_locked text[];
BEGIN
    SELECT array_agg(x.name) INTO v_locked FROM (
        SELECT l.name FROM agentlease_locks l
        WHERE l.name = ANY (p_names) AND l.owner = p_owner
        ORDER BY l.name COLLATE "C"
        FOR UPDATE
    ) x;
    v_now := clock_timestamp();  -- after any wait for the row locks

    RETURN QUERY
    UPDATE agentlease_locks l SET owner = NULL, expires_at = NULL
    WHERE l.name = ANY (v_locked) AND l.owner = p_owner AND l.expires_at > v_now
    RETURNING l.name;
END
$$;
