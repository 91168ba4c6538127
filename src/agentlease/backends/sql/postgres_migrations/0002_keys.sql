-- agentlease on PostgreSQL, schema version 2: idempotency keys, one row per key, and the function
-- that reserves one in a single call.
--
-- Applied like 0001_initial.sql: in one transaction under the schema's advisory lock, with
-- search_path set to that schema. Times are timestamptz read from clock_timestamp().

-- A key moves absent -> in_flight -> done | failed. The token exists only while a holder holds
-- the key, so every holder write matches "key = $key AND token = $token" through the primary key;
-- a released key stays in_flight with no token and no holder, ready to be taken over at once.
-- purge_at ends the dedup window: past it the key counts as absent, whether or not it was purged.
-- result and error are bytea: the bytes the client encoded, kept and returned as they are (the
-- store never parses what it only replays).
CREATE TABLE agentlease_keys (
    key         text PRIMARY KEY,
    state       text NOT NULL CONSTRAINT agentlease_keys_state
        CHECK (state IN ('in_flight', 'done', 'failed')),
    fingerprint text NOT NULL,                  -- the arguments the key was reserved with
    token       text,                           -- the holder's random token
    fence       bigint NOT NULL,                -- +1 at every reservation of the key
    holder      text NOT NULL,                  -- who holds it ('' when nobody does)
    expires_at  timestamptz,                    -- the in-flight lease (NULL once finished)
    result      bytea,
    error       bytea,
    created_at  timestamptz NOT NULL,
    finished_at timestamptz,
    purge_at    timestamptz NOT NULL,
    CONSTRAINT agentlease_keys_token CHECK (token IS NULL OR state = 'in_flight')
);

-- Purging visits only the keys whose window has ended, oldest first.
CREATE INDEX agentlease_keys_purge ON agentlease_keys (purge_at);

-- Reserve p_key for one attempt, or say why not: one call, one transaction.
--   * nothing to write (done, failed, in flight and live, or other arguments): answered from an
--     unlocked read, so a replay costs one index lookup and no commit to wait for.
--   * absent: INSERT ... ON CONFLICT DO NOTHING inserts it with fence 1. The primary key decides
--     between concurrent reservers: exactly one inserts, the others wait for it to commit and
--     then find its row.
--   * present: lock the row (FOR UPDATE), read the clock, and decide on what it holds now. Past
--     its window it is a new action on an old row (fence + 1, fresh created_at); in flight with
--     its lease run out, and either the same fingerprint or no token (released), it is taken
--     over (fence + 1, taken_over). Anything else is returned unchanged.
--   * deleted by a purge between the two statements: insert again.
-- Returns one row: reserved is the new token (NULL when nothing was reserved), taken_over, the
-- key's columns after the call (times as epoch seconds) and the clock reading that decided.
CREATE FUNCTION agentlease_reserve_key(
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
    v_token  text := replace(gen_random_uuid()::text, '-', '');
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
