-- agentlease on PostgreSQL, schema version 5: counter holds, so that a holder that dies gives
-- its units back.
--
-- Applied like 0001_initial.sql: in one transaction under the schema's advisory lock, with
-- search_path set to that schema. Times are timestamptz read from clock_timestamp(), after any
-- wait for a row lock.
--
-- A hold is units of a bounded counter taken for a token until expires_at. Its units are in the
-- counter's value while it lives (so holds and plain additions share one limit, one number).
-- Every call that changes a counter first locks the counter's row, then reads the clock and
-- deletes the counter's holds that ran out, taking their units back out of the value
-- (agentlease_lock_counter): so capacity comes back at the next step that touches the counter,
-- with no reaper running. A read (counter_get in postgres.sql) leaves the expired holds' units
-- out instead, in one statement. The index serves that: a counter's holds by expiry, so only the
-- expired are visited.
--
-- Locks. Every function here locks the counter's row first, then the hold rows; renewing a hold
-- (hold_extend in postgres.sql, one UPDATE of the hold's row with a live lease) locks only that
-- row. So no two calls wait for each other in opposite orders. A renewal that runs into a sweep
-- waits for it and then finds its row gone; a sweep that runs into a renewal waits for it, then
-- sees the new expiry and keeps the row.
CREATE TABLE agentlease_counter_holds (
    name       text NOT NULL,
    token      text NOT NULL,
    units      bigint NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (name, token)
);
CREATE INDEX agentlease_counter_holds_expiry ON agentlease_counter_holds (name, expires_at);

-- Lock a counter's row (inserting it at 0 if absent: the same as absent), read the clock, and
-- delete its holds that ran out, taking their units out of its value. Called at the start of
-- every function that changes a counter, inside its transaction.
-- Returns the value after the sweep and the clock reading.
CREATE FUNCTION agentlease_lock_counter(
    p_name text, OUT o_value bigint, OUT o_now timestamptz
)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_back bigint;
BEGIN
    LOOP
        SELECT c.value INTO o_value FROM agentlease_counters c WHERE c.name = p_name FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO agentlease_counters AS c (name, value) VALUES (p_name, 0)
        ON CONFLICT ON CONSTRAINT agentlease_counters_pkey DO NOTHING;
    END LOOP;
    o_now := clock_timestamp();  -- after any wait for the row lock
    WITH gone AS (
        DELETE FROM agentlease_counter_holds h
        WHERE h.name = p_name AND h.expires_at <= o_now
        RETURNING h.units
    )
    SELECT coalesce(sum(g.units), 0) INTO v_back FROM gone g;
    IF v_back <> 0 THEN
        UPDATE agentlease_counters c SET value = c.value - v_back WHERE c.name = p_name
        RETURNING c.value INTO o_value;
    END IF;
END
$$;

-- Add p_delta to a counter unless the result leaves [p_low, p_high] (NULL: no bound): one call,
-- one transaction, on the value after the sweep of agentlease_lock_counter. (Version 3's fast
-- path, one UPDATE, could not see the holds that ran out: it is gone.)
-- Returns one row: whether it was added, and the counter's value (the new one, or the one that
-- refused it).
CREATE OR REPLACE FUNCTION agentlease_add_counter(
    p_name text, p_delta bigint, p_low bigint, p_high bigint
)
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
    SELECT l.o_value INTO v_value FROM agentlease_lock_counter(p_name) l;
    IF (p_low IS NOT NULL AND v_value + p_delta < p_low)
       OR (p_high IS NOT NULL AND v_value + p_delta > p_high) THEN
        RETURN QUERY SELECT false, v_value;
        RETURN;
    END IF;
    UPDATE agentlease_counters c SET value = c.value + p_delta WHERE c.name = p_name
    RETURNING c.value INTO v_value;
    RETURN QUERY SELECT true, v_value;
END
$$;

-- Hold p_units of a counter for p_token until now + p_ttl, unless the value would pass p_high:
-- one call, one transaction, after the sweep. A token that is already there (a resend) changes
-- nothing.
-- Returns one row: whether it holds them, and the counter's value (the new one, or the one that
-- refused it).
CREATE FUNCTION agentlease_hold_counter(
    p_name text, p_token text, p_units bigint, p_high bigint, p_ttl double precision
)
RETURNS TABLE (added boolean, value bigint)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_value bigint;
    v_now   timestamptz;
BEGIN
    SELECT l.o_value, l.o_now INTO v_value, v_now FROM agentlease_lock_counter(p_name) l;
    PERFORM 1 FROM agentlease_counter_holds h WHERE h.name = p_name AND h.token = p_token;
    IF FOUND THEN
        RETURN QUERY SELECT true, v_value;
        RETURN;
    END IF;
    IF v_value + p_units > p_high THEN
        RETURN QUERY SELECT false, v_value;
        RETURN;
    END IF;
    UPDATE agentlease_counters c SET value = c.value + p_units WHERE c.name = p_name
    RETURNING c.value INTO v_value;
    INSERT INTO agentlease_counter_holds (name, token, units, expires_at)
    VALUES (p_name, p_token, p_units, v_now + make_interval(secs => p_ttl));
    RETURN QUERY SELECT true, v_value;
END
$$;

-- End p_token's live hold on a counter: one call, one transaction, after the sweep (so a hold
-- that ran out is gone, its units back). p_commit: its units stay in the value for good; else
-- they are taken back out.
-- Returns whether the token held something (false: nothing changed but the sweep).
CREATE FUNCTION agentlease_end_hold(p_name text, p_token text, p_commit boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_units bigint;
BEGIN
    PERFORM 1 FROM agentlease_lock_counter(p_name);
    DELETE FROM agentlease_counter_holds h WHERE h.name = p_name AND h.token = p_token
    RETURNING h.units INTO v_units;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF NOT p_commit THEN
        UPDATE agentlease_counters c SET value = c.value - v_units WHERE c.name = p_name;
    END IF;
    RETURN true;
END
$$;
