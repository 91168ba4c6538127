-- agentlease on PostgreSQL, schema version 7: retry budgets and circuit breakers shared through
-- the store, and settling a counter hold with another number of units than it held.
--
-- Applied like 0001_initial.sql: in one transaction under the schema's advisory lock, with
-- search_path set to that schema. Times are timestamptz read from clock_timestamp(), after any
-- wait for a row lock.
--
-- A budget or a breaker is one row per key, with an expires_at set to now + ttl at every write; a
-- row past it counts as absent, and the key's next write overwrites it (expired rows are not
-- deleted otherwise). Every function here is one call, one transaction, and decides as
-- agentlease/backends/_budgets.py does. The healthy paths write nothing and lock nothing: an
-- admission to a closed breaker, a success with no failures to reset, an outcome that cannot
-- count, a budget step that records nothing are one plain read. A step that may write locks the
-- row (inserting it first, expired, if absent), reads the clock after any wait, and decides on
-- what it holds: of many admissions that find a cool-down over, one takes the trial and the
-- others, waiting on the row lock, find it taken.
CREATE TABLE agentlease_budgets (
    key        text PRIMARY KEY,
    calls      bigint NOT NULL,
    retries    bigint NOT NULL,
    expires_at timestamptz NOT NULL
);

-- until_at: the end of the cool-down while open, of the trial's turn while half-open.
CREATE TABLE agentlease_breakers (
    key        text PRIMARY KEY,
    state      text NOT NULL,
    failures   bigint NOT NULL,
    fence      bigint NOT NULL,
    until_at   timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);

-- Seconds until a trial may be admitted: until_at - now while open or half-open, 0 if closed or
-- already due.
CREATE FUNCTION agentlease_breaker_wait(p_state text, p_until timestamptz, p_now timestamptz)
RETURNS double precision
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN p_state <> 'closed' AND p_until > p_now
                THEN extract(epoch FROM p_until - p_now)::float8 ELSE 0::float8 END
$$;

-- Add p_calls (a negative count adds nothing) to budget p_key and, if p_retry, grant one retry iff
-- retries < p_minimum or retries < calls * p_ratio (the calls counted after the addition; a NaN
-- product grants nothing, as on every store). A step that changed a count writes the row with
-- expires_at = now + p_ttl. Returns one row: calls, retries, whether the retry was granted.
CREATE FUNCTION agentlease_retry_budget(
    p_key text,
    p_calls bigint,
    p_retry boolean,
    p_ratio double precision,
    p_minimum bigint,
    p_ttl double precision
)
RETURNS TABLE (calls bigint, retries bigint, granted boolean)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_add     bigint := greatest(p_calls, 0);
    v_calls   bigint;
    v_retries bigint;
    v_expires timestamptz;
    v_now     timestamptz;
    v_granted boolean := false;
BEGIN
    IF v_add = 0 AND NOT p_retry THEN  -- a read
        v_now := clock_timestamp();
        SELECT b.calls, b.retries INTO v_calls, v_retries
        FROM agentlease_budgets b WHERE b.key = p_key AND b.expires_at > v_now;
        RETURN QUERY SELECT coalesce(v_calls, 0::bigint), coalesce(v_retries, 0::bigint), false;
        RETURN;
    END IF;
    LOOP
        SELECT b.calls, b.retries, b.expires_at INTO v_calls, v_retries, v_expires
        FROM agentlease_budgets b WHERE b.key = p_key FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO agentlease_budgets AS b (key, calls, retries, expires_at)
        VALUES (p_key, 0, 0, '-infinity')
        ON CONFLICT ON CONSTRAINT agentlease_budgets_pkey DO NOTHING;
    END LOOP;
    v_now := clock_timestamp();  -- after any wait for the row lock
    IF v_expires <= v_now THEN
        v_calls := 0;
        v_retries := 0;
    END IF;
    v_calls := v_calls + v_add;
    IF p_retry AND (v_retries < p_minimum
                    OR (v_calls * p_ratio <> 'NaN'::float8 AND v_retries < v_calls * p_ratio)) THEN
        v_granted := true;
        v_retries := v_retries + 1;
    END IF;
    IF v_add > 0 OR v_granted THEN
        UPDATE agentlease_budgets b
        SET calls = v_calls, retries = v_retries,
            expires_at = v_now + make_interval(secs => p_ttl)
        WHERE b.key = p_key;
    END IF;
    RETURN QUERY SELECT v_calls, v_retries, v_granted;
END
$$;

-- Whether a call to the dependency behind breaker p_key may go ahead. Closed (or absent, or
-- expired), open and cooling down, half-open with a live trial: one plain read, nothing written.
-- Open past its cool-down, or half-open whose trial's turn ran out: the row is locked and read
-- again, and if a trial is still due it becomes half-open with fence + 1 and a turn until now +
-- p_trial_for (expiry now + p_ttl), and this caller gets the trial. Returns one row: the state,
-- failures, fence, retry_after and whether this caller got the trial.
CREATE FUNCTION agentlease_breaker_admit(
    p_key text, p_trial_for double precision, p_ttl double precision
)
RETURNS TABLE (state text, failures bigint, fence bigint, retry_after double precision,
               trial boolean)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_state    text;
    v_failures bigint;
    v_fence    bigint;
    v_until    timestamptz;
    v_expires  timestamptz;
    v_now      timestamptz;
    v_locked   boolean := false;
BEGIN
    LOOP
        IF v_locked THEN
            SELECT b.state, b.failures, b.fence, b.until_at, b.expires_at
            INTO v_state, v_failures, v_fence, v_until, v_expires
            FROM agentlease_breakers b WHERE b.key = p_key FOR UPDATE;
        ELSE
            SELECT b.state, b.failures, b.fence, b.until_at, b.expires_at
            INTO v_state, v_failures, v_fence, v_until, v_expires
            FROM agentlease_breakers b WHERE b.key = p_key;
        END IF;
        -- After the read (and any wait for the row lock): no later than any write it saw.
        v_now := clock_timestamp();
        IF v_state IS NULL OR v_expires <= v_now THEN
            RETURN QUERY SELECT 'closed'::text, 0::bigint, 0::bigint, 0::float8, false;
            RETURN;
        END IF;
        IF v_state = 'closed' OR v_now < v_until THEN
            RETURN QUERY SELECT v_state, v_failures, v_fence,
                agentlease_breaker_wait(v_state, v_until, v_now), false;
            RETURN;
        END IF;
        EXIT WHEN v_locked;
        v_locked := true;  -- a trial looks due: decide again on the locked row
    END LOOP;
    UPDATE agentlease_breakers b
    SET state = 'half_open', fence = b.fence + 1,
        until_at = v_now + make_interval(secs => p_trial_for),
        expires_at = v_now + make_interval(secs => p_ttl)
    WHERE b.key = p_key;
    RETURN QUERY SELECT 'half_open'::text, v_failures, v_fence + 1,
        greatest(p_trial_for, 0::float8), true;
END
$$;

-- Report a call's outcome to breaker p_key: p_fence 0 (admitted while closed) counts only while
-- closed (a success resets the failures, a failure adds one and at p_threshold opens it until now
-- + p_cooldown); p_fence > 0 counts only as the current trial of a half-open breaker (success
-- closes it with no failures, failure reopens it until now + p_cooldown). An outcome that changes
-- nothing is decided on a plain read; any other locks the row (inserting it, expired, if absent)
-- and decides again. Every write sets expires_at = now + p_ttl (an expired row starts over:
-- closed, no failures, fence 0). Returns one row: the state after the step, trial false.
CREATE FUNCTION agentlease_breaker_record(
    p_key text,
    p_fence bigint,
    p_ok boolean,
    p_threshold bigint,
    p_cooldown double precision,
    p_ttl double precision
)
RETURNS TABLE (state text, failures bigint, fence bigint, retry_after double precision,
               trial boolean)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_state    text;
    v_failures bigint;
    v_fence    bigint;
    v_until    timestamptz;
    v_expires  timestamptz;
    v_now      timestamptz;
    v_locked   boolean := false;
BEGIN
    LOOP
        IF v_locked THEN
            LOOP
                SELECT b.state, b.failures, b.fence, b.until_at, b.expires_at
                INTO v_state, v_failures, v_fence, v_until, v_expires
                FROM agentlease_breakers b WHERE b.key = p_key FOR UPDATE;
                EXIT WHEN FOUND;
                INSERT INTO agentlease_breakers AS b
                    (key, state, failures, fence, until_at, expires_at)
                VALUES (p_key, 'closed', 0, 0, '-infinity', '-infinity')
                ON CONFLICT ON CONSTRAINT agentlease_breakers_pkey DO NOTHING;
            END LOOP;
        ELSE
            SELECT b.state, b.failures, b.fence, b.until_at, b.expires_at
            INTO v_state, v_failures, v_fence, v_until, v_expires
            FROM agentlease_breakers b WHERE b.key = p_key;
        END IF;
        v_now := clock_timestamp();  -- after any wait for the row lock
        IF v_state IS NULL OR v_expires <= v_now THEN
            v_state := 'closed';
            v_failures := 0;
            v_fence := 0;
            v_until := '-infinity';
        END IF;
        IF NOT ((p_fence = 0 AND v_state = 'closed' AND NOT (p_ok AND v_failures = 0))
                OR (p_fence > 0 AND v_state = 'half_open' AND p_fence = v_fence)) THEN
            RETURN QUERY SELECT v_state, v_failures, v_fence,
                agentlease_breaker_wait(v_state, v_until, v_now), false;
            RETURN;
        END IF;
        EXIT WHEN v_locked;
        v_locked := true;  -- a write is due: decide again on the locked row
    END LOOP;
    IF p_fence = 0 THEN
        IF p_ok THEN
            v_failures := 0;
        ELSE
            v_failures := v_failures + 1;
            IF v_failures >= p_threshold THEN
                v_state := 'open';
                v_until := v_now + make_interval(secs => p_cooldown);
            END IF;
        END IF;
    ELSIF p_ok THEN
        v_state := 'closed';
        v_failures := 0;
    ELSE
        v_state := 'open';
        v_until := v_now + make_interval(secs => p_cooldown);
    END IF;
    IF v_state = 'closed' THEN
        v_until := '-infinity';
    END IF;
    UPDATE agentlease_breakers b
    SET state = v_state, failures = v_failures, fence = v_fence, until_at = v_until,
        expires_at = v_now + make_interval(secs => p_ttl)
    WHERE b.key = p_key;
    RETURN QUERY SELECT v_state, v_failures, v_fence,
        agentlease_breaker_wait(v_state, v_until, v_now), false;
END
$$;

-- End p_token's live hold on a counter and keep p_units taken for good instead of the units it
-- held (the value moves by p_units - held), after the sweep of agentlease_lock_counter
-- (0005_holds.sql), in one call. Returns whether the token held something (false: nothing
-- changed but the sweep).
CREATE FUNCTION agentlease_settle_hold(p_name text, p_token text, p_units bigint)
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
    IF p_units <> v_units THEN
        UPDATE agentlease_counters c SET value = c.value - v_units + p_units
        WHERE c.name = p_name;
    END IF;
    RETURN true;
END
$$;
