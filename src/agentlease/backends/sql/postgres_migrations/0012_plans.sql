-- agentlease on PostgreSQL, schema version 12: plans (approval gates), and a version for every
-- counter.
--
-- Applied like 0001_initial.sql: in one transaction under the schema's advisory lock, with
-- search_path set to that schema. Times are timestamptz read from clock_timestamp(), after any
-- wait for a lock.
--
-- 1. agentlease_counters.version: raised by one by every step that changes a counter's stored
--    value (a counter's value alone is open to ABA: a plan that read 3 must not act on a 3 that
--    went to 4 and back). Counters that exist keep their values and start at version 0 (adding
--    a column with a constant default only changes the catalog). The functions that write a
--    counter's value are replaced here, same signatures and outcomes, each raising the version
--    as it changes the value: agentlease_add_counter and agentlease_hold_counter (a step of 0
--    units changes nothing), agentlease_end_hold when it gives the units back,
--    agentlease_settle_hold when it keeps another number of units than were held, and
--    agentlease_lock_counter, which gives back the units of the holds that ran out: one version
--    per hold given back. A read (counter_version in postgres.sql) counts the holds that ran out
--    and are not yet given back the same way, so it reports the value and version the next step
--    on the counter will find: two reads at one version saw one value.
-- 2. agentlease_plans: the receipt of each plan acted on, by plan id, kept until purge_at
--    (deleted by state_purge in postgres.sql, oldest first, through the index on purge_at). A
--    receipt past purge_at counts as absent.
-- 3. agentlease_secrets: the store's secrets by name, made once, first writer wins
--    (agentlease_secret). 'plan' is the key of the MACs of plans: whoever may read it may seal
--    a plan this store accepts.
-- 4. agentlease_act_plan: a plan acted on, all or nothing, in one call (see its comment).
--
-- Clients of version 11 are refused by a schema at version 12 (SchemaTooNew), as by any newer
-- schema; the functions replaced here keep their signatures all the same.

ALTER TABLE agentlease_counters ADD COLUMN version bigint NOT NULL DEFAULT 0;

CREATE TABLE agentlease_plans (
    id          text PRIMARY KEY,
    approved_by text NOT NULL,
    approved_at timestamptz NOT NULL,
    versions    bigint[] NOT NULL,
    purge_at    timestamptz NOT NULL
);
CREATE INDEX agentlease_plans_purge ON agentlease_plans (purge_at);

CREATE TABLE agentlease_secrets (
    name  text PRIMARY KEY,
    value bytea NOT NULL
);

-- The secret p_name: the one stored, or else p_candidate (random bytes the client drew), stored
-- now. Of many first calls at once, one inserts and the others, after its commit, read its
-- value: every caller gets the same bytes. The common case is one plain read.
CREATE FUNCTION agentlease_secret(p_name text, p_candidate bytea)
RETURNS bytea
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_value bytea;
BEGIN
    LOOP
        SELECT s.value INTO v_value FROM agentlease_secrets s WHERE s.name = p_name;
        EXIT WHEN FOUND;
        INSERT INTO agentlease_secrets AS s (name, value) VALUES (p_name, p_candidate)
        ON CONFLICT ON CONSTRAINT agentlease_secrets_pkey DO NOTHING
        RETURNING s.value INTO v_value;
        EXIT WHEN FOUND;
    END LOOP;
    RETURN v_value;
END
$$;

-- agentlease_lock_counter of 0005_holds.sql; the holds that ran out raise the version by one
-- each (a hold of 0 units changes no value, and counts for nothing).
CREATE OR REPLACE FUNCTION agentlease_lock_counter(
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
    v_gone bigint;
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
    SELECT coalesce(sum(g.units), 0), count(*) FILTER (WHERE g.units <> 0)
    INTO v_back, v_gone FROM gone g;
    IF v_gone <> 0 THEN
        UPDATE agentlease_counters c SET value = c.value - v_back, version = c.version + v_gone
        WHERE c.name = p_name
        RETURNING c.value INTO o_value;
    END IF;
END
$$;

-- agentlease_add_counter of 0005_holds.sql; an addition raises the version.
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
    IF p_delta <> 0 THEN
        UPDATE agentlease_counters c SET value = c.value + p_delta, version = c.version + 1
        WHERE c.name = p_name
        RETURNING c.value INTO v_value;
    END IF;
    RETURN QUERY SELECT true, v_value;
END
$$;

-- agentlease_hold_counter of 0005_holds.sql; a new hold raises the version.
CREATE OR REPLACE FUNCTION agentlease_hold_counter(
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
    UPDATE agentlease_counters c
    SET value = c.value + p_units,
        version = c.version + CASE WHEN p_units <> 0 THEN 1 ELSE 0 END
    WHERE c.name = p_name
    RETURNING c.value INTO v_value;
    INSERT INTO agentlease_counter_holds (name, token, units, expires_at)
    VALUES (p_name, p_token, p_units, v_now + make_interval(secs => p_ttl));
    RETURN QUERY SELECT true, v_value;
END
$$;

-- agentlease_end_hold of 0005_holds.sql; units given back raise the version.
CREATE OR REPLACE FUNCTION agentlease_end_hold(p_name text, p_token text, p_commit boolean)
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
    IF NOT p_commit AND v_units <> 0 THEN
        UPDATE agentlease_counters c SET value = c.value - v_units, version = c.version + 1
        WHERE c.name = p_name;
    END IF;
    RETURN true;
END
$$;

-- agentlease_settle_hold of 0007_budgets.sql; another number of units than held raises the
-- version.
CREATE OR REPLACE FUNCTION agentlease_settle_hold(p_name text, p_token text, p_units bigint)
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
        UPDATE agentlease_counters c
        SET value = c.value - v_units + p_units, version = c.version + 1
        WHERE c.name = p_name;
    END IF;
    RETURN true;
END
$$;

-- Act on plan p_id, all or nothing, in one call (Backend.act_plan in backends/base.py):
--
--  1. take the plan's advisory lock (a hash of schema and id: approvals of one plan queue here,
--     and each after the first finds the receipt), then read the clock; a live receipt
--     (purge_at > now) is returned as it is ('replay'), and nothing else is done;
--  2. p_not_after at or before now: 'expired' (approved_at holds now); nothing written;
--  3. lock the rows of every record the plan reads or writes, in code point order, an absent
--     one inserted first at version 0 (a placeholder, the same as absent: a concurrent first
--     write of it waits for this call, as it would for another write), then the rows of every
--     counter it reads or writes, in code point order, with agentlease_lock_counter (which
--     gives back the holds that ran out); every plan and every single write takes its rows in
--     this order, records before counters, so none deadlocks with another;
--  4. compare each read with its current version, in order: a record's version, a counter's
--     version, the version column of the row a pin names (p_pins, aligned with the reads: the
--     schema or NULL, the table, the column, and "where" as [column, value as text or NULL]
--     pairs; looked up by the caller's search_path, read FOR SHARE so that it stays as read until
--     this call commits; no row: 0). Any that differ: 'stale', with each one;
--  5. the writes, in order: a record write through agentlease_write_record (its outcome, with
--     the record as it is, on a refusal), a counter step through agentlease_add_counter
--     ('limit', with the counter's value, on a refusal);
--  6. delete the placeholders no write used, and keep the receipt (approved_by, now, each write's
--     version after it) until now + p_keep_for.
--
-- Steps 3 to 6 run in one block: any refusal (stale, a pin that cannot be read, a write
-- refused) rolls back all of it, placeholders included, and is returned as one row. at_write is
-- the 1-based write refused. The arrays of the writes are aligned by write; a record write's
-- fields (p_field_names, p_field_values) and allowed guard values (p_allowed_values) are flat,
-- each element tagged with its write's index (p_field_of, p_allowed_of).
CREATE FUNCTION agentlease_act_plan(
    p_id text,
    p_approved_by text,
    p_keep_for double precision,
    p_not_after double precision,
    p_read_kinds text[],
    p_read_keys text[],
    p_read_versions bigint[],
    p_pins jsonb,
    p_write_kinds text[],
    p_write_keys text[],
    p_replace boolean[],
    p_expected bigint[],
    p_guard text[],
    p_allow_absent boolean[],
    p_fence bigint[],
    p_field_of integer[],
    p_field_names text[],
    p_field_values bytea[],
    p_allowed_of integer[],
    p_allowed_values bytea[],
    p_delta bigint[],
    p_low bigint[],
    p_high bigint[]
)
RETURNS TABLE (
    outcome text,
    approved_by text,
    approved_at double precision,
    versions bigint[],
    stale_kinds text[],
    stale_keys text[],
    stale_read bigint[],
    stale_now bigint[],
    at_write integer,
    version bigint,
    fence bigint,
    updated_at double precision,
    fields text[],
    vals bytea[],
    value bigint,
    detail text
)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz;
    v_receipt  agentlease_plans;
    v_key      text;
    v_made     text[] := '{}';
    v_current  bigint;
    v_rows     integer;
    v_pin      jsonb;
    v_sql      text;
    v_outcome  text;
    v_detail   text;
    v_at       integer;
    v_kinds    text[] := '{}';
    v_keys     text[] := '{}';
    v_read     bigint[] := '{}';
    v_seen     bigint[] := '{}';
    v_versions bigint[] := '{}';
    v_written  record;
    v_added    boolean;
    v_value    bigint;
    v_version  bigint;
    v_fence    bigint;
    v_updated  double precision;
    v_fields   text[];
    v_vals     bytea[];
BEGIN
    PERFORM pg_advisory_xact_lock(
        hashtextextended('agentlease-plan:' || current_schema() || ':' || p_id, 0)
    );
    v_now := clock_timestamp();  -- after any wait for the plan's lock
    SELECT p.* INTO v_receipt FROM agentlease_plans p WHERE p.id = p_id;
    IF FOUND AND v_receipt.purge_at > v_now THEN
        RETURN QUERY SELECT 'replay'::text, v_receipt.approved_by,
            extract(epoch FROM v_receipt.approved_at)::float8, v_receipt.versions,
            NULL::text[], NULL::text[], NULL::bigint[], NULL::bigint[], NULL::integer,
            NULL::bigint, NULL::bigint, NULL::float8, NULL::text[], NULL::bytea[], NULL::bigint,
            NULL::text;
        RETURN;
    END IF;
    IF p_not_after IS NOT NULL AND p_not_after <= extract(epoch FROM v_now)::float8 THEN
        RETURN QUERY SELECT 'expired'::text, NULL::text, extract(epoch FROM v_now)::float8,
            NULL::bigint[], NULL::text[], NULL::text[], NULL::bigint[], NULL::bigint[],
            NULL::integer, NULL::bigint, NULL::bigint, NULL::float8, NULL::text[], NULL::bytea[],
            NULL::bigint, NULL::text;
        RETURN;
    END IF;

    BEGIN
        -- 3. Rows, in one order: records, then counters, each by code point.
        FOR v_key IN
            SELECT DISTINCT u.key COLLATE "C"
            FROM unnest(p_read_kinds || p_write_kinds, p_read_keys || p_write_keys)
                AS u(kind, key)
            WHERE u.kind = 'record'
            ORDER BY 1
        LOOP
            LOOP
                PERFORM 1 FROM agentlease_records r WHERE r.key = v_key FOR UPDATE;
                EXIT WHEN FOUND;
                INSERT INTO agentlease_records AS r (key, version, fence, updated_at)
                VALUES (v_key, 0, 0, clock_timestamp())
                ON CONFLICT ON CONSTRAINT agentlease_records_pkey DO NOTHING;
                IF FOUND THEN
                    v_made := v_made || v_key;
                    EXIT;
                END IF;
            END LOOP;
        END LOOP;
        FOR v_key IN
            SELECT DISTINCT u.key COLLATE "C"
            FROM unnest(p_read_kinds || p_write_kinds, p_read_keys || p_write_keys)
                AS u(kind, key)
            WHERE u.kind = 'counter'
            ORDER BY 1
        LOOP
            PERFORM 1 FROM agentlease_lock_counter(v_key);
        END LOOP;

        -- 4. Every read, as it is now.
        FOR i IN 1 .. coalesce(cardinality(p_read_keys), 0) LOOP
            IF p_read_kinds[i] = 'record' THEN
                SELECT r.version INTO v_current FROM agentlease_records r
                WHERE r.key = p_read_keys[i];
            ELSIF p_read_kinds[i] = 'counter' THEN
                SELECT c.version INTO v_current FROM agentlease_counters c
                WHERE c.name = p_read_keys[i];
            ELSE
                v_pin := p_pins -> (i - 1);
                SELECT format(
                    'SELECT (%I)::bigint FROM %s WHERE %s LIMIT 2 FOR SHARE',
                    v_pin ->> 'column',
                    CASE WHEN v_pin ->> 'schema' IS NULL THEN format('%I', v_pin ->> 'table')
                         ELSE format('%I.%I', v_pin ->> 'schema', v_pin ->> 'table') END,
                    string_agg(
                        CASE WHEN w.pair ->> 1 IS NULL THEN format('%I IS NULL', w.pair ->> 0)
                             ELSE format('%I = %L', w.pair ->> 0, w.pair ->> 1) END,
                        ' AND ' ORDER BY w.n
                    )
                ) INTO v_sql
                FROM jsonb_array_elements(v_pin -> 'where') WITH ORDINALITY AS w(pair, n);
                BEGIN
                    EXECUTE v_sql INTO v_current;
                    GET DIAGNOSTICS v_rows = ROW_COUNT;
                EXCEPTION
                    WHEN undefined_table OR undefined_column OR undefined_function
                         OR wrong_object_type OR ambiguous_column OR datatype_mismatch
                         OR cannot_coerce OR data_exception THEN
                        v_outcome := 'pin';
                        v_detail := format('pin %s: %s', p_read_keys[i], SQLERRM);
                END;
                IF v_outcome IS NULL AND v_rows > 1 THEN
                    v_outcome := 'pin';
                    v_detail := format('pin %s: its where matches more than one row',
                                       p_read_keys[i]);
                END IF;
                IF v_outcome IS NOT NULL THEN
                    RAISE SQLSTATE 'AL001';
                END IF;
            END IF;
            v_current := coalesce(v_current, 0);
            IF v_current <> p_read_versions[i] THEN
                v_kinds := v_kinds || p_read_kinds[i];
                v_keys := v_keys || p_read_keys[i];
                v_read := v_read || p_read_versions[i];
                v_seen := v_seen || v_current;
            END IF;
        END LOOP;
        IF cardinality(v_keys) > 0 THEN
            v_outcome := 'stale';
            RAISE SQLSTATE 'AL001';
        END IF;

        -- 5. The writes, in order, each with its own guards.
        FOR i IN 1 .. coalesce(cardinality(p_write_keys), 0) LOOP
            IF p_write_kinds[i] = 'record' THEN
                SELECT w.outcome, w.version, w.fence, w.updated_at, w.fields, w.vals
                INTO v_written
                FROM agentlease_write_record(
                    p_write_keys[i],
                    array(SELECT f.name FROM unnest(p_field_of, p_field_names)
                              WITH ORDINALITY AS f(w, name, n)
                          WHERE f.w = i ORDER BY f.n),
                    array(SELECT f.value FROM unnest(p_field_of, p_field_values)
                              WITH ORDINALITY AS f(w, value, n)
                          WHERE f.w = i ORDER BY f.n),
                    p_replace[i], p_expected[i], p_guard[i],
                    array(SELECT a.value FROM unnest(p_allowed_of, p_allowed_values)
                              WITH ORDINALITY AS a(w, value, n)
                          WHERE a.w = i ORDER BY a.n),
                    p_allow_absent[i], p_fence[i]
                ) w;
                IF v_written.outcome <> 'ok' THEN
                    v_outcome := v_written.outcome;
                    v_at := i;
                    v_version := v_written.version;
                    v_fence := v_written.fence;
                    v_updated := v_written.updated_at;
                    v_fields := v_written.fields;
                    v_vals := v_written.vals;
                    RAISE SQLSTATE 'AL001';
                END IF;
                v_versions := v_versions || v_written.version;
            ELSE
                SELECT a.added, a.value INTO v_added, v_value
                FROM agentlease_add_counter(p_write_keys[i], p_delta[i], p_low[i], p_high[i]) a;
                IF NOT v_added THEN
                    v_outcome := 'limit';
                    v_at := i;
                    RAISE SQLSTATE 'AL001';
                END IF;
                SELECT c.version INTO v_current FROM agentlease_counters c
                WHERE c.name = p_write_keys[i];
                v_versions := v_versions || v_current;
            END IF;
        END LOOP;

        -- 6. No placeholder outlives the call; the receipt is kept.
        IF cardinality(v_made) > 0 THEN
            DELETE FROM agentlease_records r WHERE r.key = ANY (v_made) AND r.version = 0;
        END IF;
        v_now := clock_timestamp();
        INSERT INTO agentlease_plans AS p (id, approved_by, approved_at, versions, purge_at)
        VALUES (p_id, p_approved_by, v_now, v_versions,
                v_now + make_interval(secs => p_keep_for))
        ON CONFLICT ON CONSTRAINT agentlease_plans_pkey DO UPDATE
        SET approved_by = excluded.approved_by, approved_at = excluded.approved_at,
            versions = excluded.versions, purge_at = excluded.purge_at;
    EXCEPTION
        WHEN SQLSTATE 'AL001' THEN  -- a refusal: everything of the block is rolled back
            RETURN QUERY SELECT v_outcome, NULL::text, NULL::float8, NULL::bigint[],
                v_kinds, v_keys, v_read, v_seen, v_at, v_version, v_fence, v_updated, v_fields,
                v_vals, v_value, v_detail;
            RETURN;
    END;
    RETURN QUERY SELECT 'acted'::text, p_approved_by, extract(epoch FROM v_now)::float8,
        v_versions, NULL::text[], NULL::text[], NULL::bigint[], NULL::bigint[], NULL::integer,
        NULL::bigint, NULL::bigint, NULL::float8, NULL::text[], NULL::bytea[], NULL::bigint,
        NULL::text;
END
$$;
