-- Named queries of the SQLite backend. Parameters are named (:name); times are seconds since the
-- epoch on this machine's clock, read inside the transaction that uses them.
--
-- Idempotency keys (key_*): a key whose purge_at has passed counts as absent everywhere. Holder
-- writes are fenced by "token = :token AND state = 'in_flight'" (and the key not past its
-- window): the token, not the clock, decides, so a late holder nobody took over still writes.
--
-- Shared-state guards (record_*, counter_*, hold_*, locks_*, budget_*, breaker_*): names of a lock set travel as one JSON
-- array (:names) read with json_each. A lock is held while it has an owner and
-- expires_at > :now, so an expired lock is free whether or not a sweep has cleared it.
--
-- Cancellation (schema version 8): cancel_reason is set when a cancel is asked for, with the
-- cancel error in error. A waiting task becomes 'cancelled' at once; a leased one keeps its
-- state, and every holder write requires cancel_reason IS NULL, so the holder's writes are
-- refused; its next extend (cancel_held) or the reaper (reap_cancel) makes it 'cancelled'.
--
-- Partitions (schema version 4): a task with a partition is stored 'parked' while its partition
-- is busy (a task of it scheduled, queued, leased or failed). The trigger agentlease_unpark
-- starts the next parked task when a task of the partition becomes done, dead or cancelled,
-- inside the statement that made it so: complete, fail, a reap, a cancel, whatever the path.

-- name: schema
-- Run statement by statement, split on semicolons: keep them out of the comments here.
CREATE TABLE IF NOT EXISTS agentlease_queues (
    name TEXT PRIMARY KEY,
    seq  INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS agentlease_tasks (
    id               TEXT PRIMARY KEY,
    queue            TEXT NOT NULL,
    state            TEXT NOT NULL,
    priority         INTEGER NOT NULL,
    seq              INTEGER NOT NULL,
    payload          BLOB NOT NULL,
    dedup_key        TEXT,
    attempt          INTEGER NOT NULL DEFAULT 0,
    reclaims         INTEGER NOT NULL DEFAULT 0,
    failures         INTEGER NOT NULL DEFAULT 0,
    max_reclaims     INTEGER NOT NULL,
    created_at       REAL NOT NULL,
    run_at           REAL NOT NULL,
    token            TEXT,
    leased_at        REAL,
    expires_at       REAL,
    lease_deadline   REAL,
    progress_timeout REAL,
    progressed_at    REAL,
    finished_at      REAL,
    progress         BLOB,
    checkpoint       BLOB,
    result           BLOB,
    error            BLOB,
    partition        TEXT,
    context          BLOB,
    cancel_reason    TEXT,
    holder           TEXT
);
-- Partial indexes: claim, promotion and reaping touch only live rows, so their cost does not grow
-- with the number of finished tasks.
CREATE INDEX IF NOT EXISTS agentlease_ready
    ON agentlease_tasks (queue, priority DESC, seq) WHERE state = 'queued';
CREATE INDEX IF NOT EXISTS agentlease_waiting
    ON agentlease_tasks (queue, run_at) WHERE state IN ('scheduled', 'failed');
CREATE INDEX IF NOT EXISTS agentlease_leased
    ON agentlease_tasks (queue, expires_at) WHERE state = 'leased';
CREATE INDEX IF NOT EXISTS agentlease_dead
    ON agentlease_tasks (queue, finished_at) WHERE state = 'dead';
-- Retention (schema version 9): done tasks by finished time, so a purge visits only the tasks it
-- deletes (dead letters have agentlease_dead). Built over the tasks already there when an older
-- database is upgraded, so tasks finished before the upgrade are purged like any other.
CREATE INDEX IF NOT EXISTS agentlease_done
    ON agentlease_tasks (queue, finished_at) WHERE state = 'done';
-- Cancelled tasks by finished time (schema version 10), for their purges and listings alike.
CREATE INDEX IF NOT EXISTS agentlease_cancelled
    ON agentlease_tasks (queue, finished_at) WHERE state = 'cancelled';
CREATE UNIQUE INDEX IF NOT EXISTS agentlease_dedup
    ON agentlease_tasks (queue, dedup_key) WHERE dedup_key IS NOT NULL;
-- Partitions (schema version 4). The busy index answers "is the partition busy" without
-- visiting finished tasks, and the parked index finds a partition's next task (lowest seq) and
-- counts parked tasks for stats, without visiting the runnable ones. Neither grows the cost of
-- claim, promotion or reaping, whose indexes never hold a parked task.
CREATE INDEX IF NOT EXISTS agentlease_busy
    ON agentlease_tasks (queue, partition)
    WHERE partition IS NOT NULL AND state IN ('scheduled', 'queued', 'leased', 'failed');
CREATE INDEX IF NOT EXISTS agentlease_parked
    ON agentlease_tasks (queue, partition, seq) WHERE state = 'parked';
-- Idempotency keys (schema version 2), one row per key. A rowid table, not WITHOUT ROWID: a row
-- carries a result or error of any size, and SQLite advises WITHOUT ROWID only for small rows.
-- The token exists only while a holder holds the key (in_flight), and a released key keeps
-- state in_flight with no token and no holder. purge_at is the end of the dedup window, and its
-- index lets purging visit expired keys only.
CREATE TABLE IF NOT EXISTS agentlease_keys (
    key         TEXT PRIMARY KEY,
    state       TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    token       TEXT,
    fence       INTEGER NOT NULL,
    holder      TEXT NOT NULL,
    expires_at  REAL,
    result      BLOB,
    error       BLOB,
    created_at  REAL NOT NULL,
    finished_at REAL,
    purge_at    REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS agentlease_keys_purge ON agentlease_keys (purge_at);
-- Shared-state guards (schema version 3). A versioned record is one row of agentlease_records
-- and one row per field in agentlease_record_fields (values of any size: a rowid table). Every
-- write of a record runs in one BEGIN IMMEDIATE transaction, so writers of different fields
-- never lose each other's writes. A record is never deleted.
CREATE TABLE IF NOT EXISTS agentlease_records (
    key        TEXT PRIMARY KEY,
    version    INTEGER NOT NULL,
    fence      INTEGER NOT NULL,
    updated_at REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS agentlease_record_fields (
    key   TEXT NOT NULL,
    field TEXT NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (key, field)
);
-- A counter's version (schema version 11) rises by one with every statement that changes its
-- value (counter_set: steps, holds, and giving back the units of expired holds).
CREATE TABLE IF NOT EXISTS agentlease_counters (
    name    TEXT PRIMARY KEY,
    value   INTEGER NOT NULL,
    version INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
-- A counter hold (schema version 5): units of a counter held by a token until expires_at. Its
-- units are in the counter's value while it lives, and every step that touches the counter first
-- deletes its expired holds and takes their units back out (counter_sweep), so the index is by
-- counter, then expiry.
CREATE TABLE IF NOT EXISTS agentlease_counter_holds (
    name       TEXT NOT NULL,
    token      TEXT NOT NULL,
    units      INTEGER NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (name, token)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS agentlease_counter_holds_expiry
    ON agentlease_counter_holds (name, expires_at);
-- A lock row is never deleted, so its fence only rises: a free lock has no owner and no expiry.
-- The partial index on expires_at lets a sweep visit held locks by expiry, and never free ones.
CREATE TABLE IF NOT EXISTS agentlease_locks (
    name       TEXT PRIMARY KEY,
    owner      TEXT,
    expires_at REAL,
    fence      INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS agentlease_locks_expiry
    ON agentlease_locks (expires_at) WHERE owner IS NOT NULL;
-- Retry budgets and circuit breakers (schema version 6), one row per key. A row whose expires_at
-- has passed counts as absent and is overwritten by the key's next write, or deleted by
-- purge_state (schema version 9). A breaker's until is the end of its cool-down while open, the end of its
-- trial's turn while half-open, 0 while closed.
CREATE TABLE IF NOT EXISTS agentlease_budgets (
    key        TEXT PRIMARY KEY,
    calls      INTEGER NOT NULL,
    retries    INTEGER NOT NULL,
    expires_at REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS agentlease_breakers (
    key        TEXT PRIMARY KEY,
    state      TEXT NOT NULL,
    failures   INTEGER NOT NULL,
    fence      INTEGER NOT NULL,
    until      REAL NOT NULL,
    expires_at REAL NOT NULL
) WITHOUT ROWID;
-- Retention (schema version 9): expired budgets and breakers are deleted through these, oldest
-- first, visiting only the rows deleted.
CREATE INDEX IF NOT EXISTS agentlease_budgets_expiry ON agentlease_budgets (expires_at);
CREATE INDEX IF NOT EXISTS agentlease_breakers_expiry ON agentlease_breakers (expires_at);

-- Attempt history (schema version 10): one row per attempt of a task that ended otherwise than
-- done, the last 20 kept, written by the trigger agentlease_attempt_close inside the statement
-- that ends the lease (the running attempt and a done task's last one are the task's own row). Live workers: one row per worker id, listed while expires_at is
-- ahead (register_worker deletes lapsed rows through the expiry index).
CREATE TABLE IF NOT EXISTS agentlease_attempts (
    task_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    worker  TEXT,
    started REAL NOT NULL,
    ended   REAL,
    outcome TEXT,
    error   TEXT,
    PRIMARY KEY (task_id, attempt)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS agentlease_workers (
    id         TEXT PRIMARY KEY,
    info       BLOB NOT NULL,
    beat_at    REAL NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS agentlease_workers_expiry ON agentlease_workers (expires_at);
-- Plans (schema version 11): the receipt of each plan acted on, kept until purge_at (versions is
-- the JSON array of the versions its writes left), deleted by purge_state through the index.
-- The store's plan secret is one row, made by the first caller (INSERT OR IGNORE).
CREATE TABLE IF NOT EXISTS agentlease_plan_receipts (
    id          TEXT PRIMARY KEY,
    approved_by TEXT NOT NULL,
    approved_at REAL NOT NULL,
    versions    TEXT NOT NULL,
    purge_at    REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS agentlease_plan_receipts_purge
    ON agentlease_plan_receipts (purge_at);
CREATE TABLE IF NOT EXISTS agentlease_plan_secret (
    id     INTEGER PRIMARY KEY CHECK (id = 1),
    secret BLOB NOT NULL
);

-- name: unpark_trigger
-- Run after the schema, as one statement (its body holds semicolons of its own).
-- A task of a partition became done, dead or cancelled (from any other state): if no task of the partition
-- is still busy, start its oldest parked task, queued, or scheduled if its run_at is still ahead
-- (finished_at is the statement's clock). It runs inside the statement that finished the task,
-- so that statement and the unpark are one atomic step.
CREATE TRIGGER IF NOT EXISTS agentlease_unpark
AFTER UPDATE OF state ON agentlease_tasks
WHEN NEW.partition IS NOT NULL AND NEW.state IN ('done', 'dead', 'cancelled')
     AND OLD.state NOT IN ('done', 'dead', 'cancelled')
BEGIN
    UPDATE agentlease_tasks
    SET state = CASE WHEN run_at > NEW.finished_at THEN 'scheduled' ELSE 'queued' END
    WHERE id = (SELECT id FROM agentlease_tasks
                WHERE queue = NEW.queue AND partition = NEW.partition AND state = 'parked'
                ORDER BY seq LIMIT 1)
      AND NOT EXISTS (SELECT 1 FROM agentlease_tasks
                      WHERE queue = NEW.queue AND partition = NEW.partition
                        AND state IN ('scheduled', 'queued', 'leased', 'failed'));
END;

-- name: attempt_close_trigger
-- Run after the schema, as one statement. A lease ended otherwise than done (fail, release, a
-- reap, a cancel): record its attempt, with the holder the claim wrote and its leased_at, the
-- outcome told by what the statement changed: a failure (failures + 1, with the error's type);
-- a reap (reclaims + 1): expired; back to queued otherwise: released; else the new state
-- (cancelled). The time is the task's finished_at when the statement finished it, else the
-- clock now (julianday: milliseconds), never before the lease began. Attempts past the last 20
-- are dropped. A claim and a completion write no attempt: the running attempt and the last one
-- of a done task are read from the task itself (_records.with_last_attempt), so the path nearly
-- every task takes costs no write beyond the task's own row.
CREATE TRIGGER IF NOT EXISTS agentlease_attempt_close
AFTER UPDATE OF state ON agentlease_tasks
WHEN OLD.state = 'leased' AND NEW.state NOT IN ('leased', 'done')
BEGIN
    INSERT OR REPLACE INTO agentlease_attempts
        (task_id, attempt, worker, started, ended, outcome, error)
    VALUES (
        NEW.id, OLD.attempt, OLD.holder, OLD.leased_at,
        max(CASE WHEN NEW.state IN ('dead', 'cancelled') THEN NEW.finished_at ELSE 0 END,
            coalesce(OLD.leased_at, 0), (julianday('now') - 2440587.5) * 86400.0),
        CASE WHEN NEW.failures > OLD.failures THEN 'failed'
             WHEN NEW.reclaims > OLD.reclaims THEN 'expired'
             WHEN NEW.state = 'queued' THEN 'released'
             ELSE NEW.state END,
        CASE WHEN NEW.failures > OLD.failures AND json_valid(CAST(NEW.error AS TEXT))
             THEN json_extract(CAST(NEW.error AS TEXT), '$.type') END
    );
    DELETE FROM agentlease_attempts WHERE task_id = NEW.id AND attempt <= OLD.attempt - 20;
END;

-- name: attempt_forget_trigger
-- Run after the schema, as one statement. A task deleted (delete_queue, a purge) takes its
-- attempt history with it, in the same statement.
CREATE TRIGGER IF NOT EXISTS agentlease_attempt_forget
AFTER DELETE ON agentlease_tasks
BEGIN
    DELETE FROM agentlease_attempts WHERE task_id = OLD.id;
END;

-- name: upgrade_to_4
-- Run before the schema when a database older than version 4 is opened: the schema's indexes
-- need the column, and CREATE TABLE IF NOT EXISTS leaves an existing table as it is.
ALTER TABLE agentlease_tasks ADD COLUMN partition TEXT;

-- name: upgrade_to_7
-- Run before the schema when a database older than version 7 is opened: a task's context (its
-- root task and deadline, JSON kept as enqueued), NULL for the tasks it already has.
ALTER TABLE agentlease_tasks ADD COLUMN context BLOB;

-- name: upgrade_to_8
-- Run before the schema when a database older than version 8 is opened: the cancel reason
-- column, and the unpark trigger dropped so that the schema creates it anew (it now also fires
-- when a task becomes cancelled). Run statement by statement, as the schema is.
ALTER TABLE agentlease_tasks ADD COLUMN cancel_reason TEXT;
DROP TRIGGER IF EXISTS agentlease_unpark;

-- name: upgrade_to_10
-- Run before the schema when a database older than version 10 is opened: the worker that holds
-- each lease (NULL for the tasks already there). The schema adds the attempts and workers
-- tables. (No semicolon in these comments: the steps are split on them.)
ALTER TABLE agentlease_tasks ADD COLUMN holder TEXT;

-- name: upgrade_to_11
-- Run before the schema when a database older than version 11 is opened: each counter's version
-- (0 for the counters already there). The schema adds the plan receipts and the plan secret.
ALTER TABLE agentlease_counters ADD COLUMN version INTEGER NOT NULL DEFAULT 0;

-- name: bump_seq
INSERT INTO agentlease_queues (name, seq) VALUES (:queue, :count)
ON CONFLICT (name) DO UPDATE SET seq = seq + :count
RETURNING seq;

-- name: insert_task
INSERT OR IGNORE INTO agentlease_tasks
    (id, queue, state, priority, seq, payload, dedup_key, max_reclaims, created_at, run_at,
     context)
VALUES
    (:id, :queue, :state, :priority, :seq, :payload, :dedup_key, :max_reclaims, :now, :run_at,
     :context);

-- name: insert_partitioned
-- A task with a partition: parked when the partition is busy, which includes a task inserted
-- earlier in the same transaction (an earlier task of the same enqueue call).
INSERT OR IGNORE INTO agentlease_tasks
    (id, queue, state, priority, seq, payload, dedup_key, max_reclaims, created_at, run_at,
     partition, context)
VALUES
    (:id, :queue,
     CASE WHEN EXISTS (
         SELECT 1 FROM agentlease_tasks
         WHERE queue = :queue AND partition = :partition
           AND state IN ('scheduled', 'queued', 'leased', 'failed')
     ) THEN 'parked' ELSE :state END,
     :priority, :seq, :payload, :dedup_key, :max_reclaims, :now, :run_at, :partition, :context);

-- name: find_existing
SELECT id FROM agentlease_tasks
WHERE id = :id OR (queue = :queue AND dedup_key = :dedup_key)
LIMIT 1;

-- name: probe
SELECT EXISTS (SELECT 1 FROM agentlease_tasks WHERE queue = :queue AND state = 'queued')
    OR EXISTS (SELECT 1 FROM agentlease_tasks
               WHERE queue = :queue AND state IN ('scheduled', 'failed') AND run_at <= :now)
    OR EXISTS (SELECT 1 FROM agentlease_tasks
               WHERE queue = :queue AND state = 'leased' AND expires_at <= :now);

-- name: promote
UPDATE agentlease_tasks SET state = 'queued'
WHERE queue = :queue AND state IN ('scheduled', 'failed') AND run_at <= :now;

-- name: expired
SELECT id, attempt, reclaims, max_reclaims, seq, cancel_reason FROM agentlease_tasks
WHERE queue = :queue AND state = 'leased' AND expires_at <= :now;

-- name: reap_cancel
-- An expired lease whose task a cancel was asked for ends cancelled, never requeued.
UPDATE agentlease_tasks
SET state = 'cancelled', token = NULL, expires_at = NULL, finished_at = :now
WHERE id = :id;

-- name: reap_requeue
UPDATE agentlease_tasks
SET state = 'queued', token = NULL, expires_at = NULL, reclaims = :reclaims, seq = :seq
WHERE id = :id;

-- name: reap_dead
UPDATE agentlease_tasks
SET state = 'dead', token = NULL, expires_at = NULL, reclaims = :reclaims, finished_at = :now,
    error = :error
WHERE id = :id;

-- name: claim
UPDATE agentlease_tasks
SET state = 'leased', token = lower(hex(randomblob(16))), attempt = attempt + 1,
    leased_at = :now, expires_at = :expires_at, lease_deadline = :deadline,
    progress_timeout = :progress_timeout, progressed_at = :now, holder = :holder
WHERE id IN (SELECT id FROM agentlease_tasks
             WHERE queue = :queue AND state = 'queued'
             ORDER BY priority DESC, seq LIMIT :n)
RETURNING id, token, attempt, payload, checkpoint, priority, failures, reclaims, seq, context,
          run_at;

-- name: extend
-- The new expiry is agentlease._policy.lease.lease_expiry, written in SQL.
UPDATE agentlease_tasks
SET expires_at = min(:now + :lease_for, lease_deadline,
                     coalesce(progressed_at + progress_timeout, 1e308))
FROM (SELECT value ->> 0 AS lid, value ->> 1 AS ltoken FROM json_each(:leases))
WHERE id = lid AND token = ltoken AND state = 'leased' AND expires_at > :now
  AND cancel_reason IS NULL
RETURNING id, token, expires_at;

-- name: cancel_held
-- After an extend, the leases it did not renew whose task a cancel was asked for (held under
-- that token): the holder is told now, and the task ends cancelled.
UPDATE agentlease_tasks
SET state = 'cancelled', token = NULL, expires_at = NULL, finished_at = :now
FROM (SELECT value ->> 0 AS lid, value ->> 1 AS ltoken FROM json_each(:leases))
WHERE id = lid AND token = ltoken AND state = 'leased' AND cancel_reason IS NOT NULL;

-- name: complete
UPDATE agentlease_tasks
SET state = 'done', result = :result, finished_at = :now, token = NULL, expires_at = NULL
WHERE id = :id AND token = :token AND state = 'leased' AND expires_at > :now
  AND cancel_reason IS NULL;

-- name: fail_retry
UPDATE agentlease_tasks
SET state = 'failed', failures = failures + 1, error = :error, run_at = :now + :retry_in,
    token = NULL, expires_at = NULL
WHERE id = :id AND token = :token AND state = 'leased' AND expires_at > :now
  AND cancel_reason IS NULL
RETURNING id, queue, state, priority, payload, attempt, reclaims, failures, max_reclaims,
          created_at, run_at, dedup_key, leased_at, expires_at, finished_at, progress, checkpoint,
          result, error, partition, context;

-- name: fail_dead
UPDATE agentlease_tasks
SET state = 'dead', failures = failures + 1, error = :error, finished_at = :now,
    token = NULL, expires_at = NULL
WHERE id = :id AND token = :token AND state = 'leased' AND expires_at > :now
  AND cancel_reason IS NULL
RETURNING id, queue, state, priority, payload, attempt, reclaims, failures, max_reclaims,
          created_at, run_at, dedup_key, leased_at, expires_at, finished_at, progress, checkpoint,
          result, error, partition, context;

-- name: release
UPDATE agentlease_tasks
SET state = 'queued', token = NULL, expires_at = NULL,
    seq = CASE WHEN :front THEN (CASE WHEN seq >= 0 THEN seq - :offset ELSE seq END) ELSE :seq END
WHERE id = :id AND token = :token AND state = 'leased' AND expires_at > :now
  AND cancel_reason IS NULL;

-- name: progress
UPDATE agentlease_tasks
SET progress = :progress, checkpoint = coalesce(:checkpoint, checkpoint), progressed_at = :now
WHERE id = :id AND token = :token AND state = 'leased' AND expires_at > :now
  AND cancel_reason IS NULL;

-- name: fence_state
SELECT attempt, state, token, expires_at, cancel_reason FROM agentlease_tasks WHERE id = :id;

-- name: get
SELECT id, queue, state, priority, payload, attempt, reclaims, failures, max_reclaims,
       created_at, run_at, dedup_key, leased_at, expires_at, finished_at, progress, checkpoint,
       result, error, partition, context, cancel_reason,
       (SELECT json_group_array(json_object(
                   'attempt', a.attempt, 'worker', a.worker, 'started', a.started,
                   'ended', a.ended, 'outcome', a.outcome, 'error', a.error))
        FROM (SELECT * FROM agentlease_attempts WHERE task_id = :id ORDER BY attempt) a),
       holder
FROM agentlease_tasks WHERE id = :id;

-- name: cancel_state
SELECT state, expires_at, cancel_reason FROM agentlease_tasks WHERE id = :id;

-- name: cancel_request
-- A cancel of a live lease: flagged with its reason and error; the holder is told later.
UPDATE agentlease_tasks SET cancel_reason = :reason, error = :error
WHERE id = :id AND cancel_reason IS NULL;

-- name: cancel_now
-- A cancel of a waiting task, or of a lease that ran out: cancelled at once (the trigger
-- starts its partition's next task). A reason asked for earlier is kept.
UPDATE agentlease_tasks
SET state = 'cancelled', token = NULL, expires_at = NULL, finished_at = :now,
    error = CASE WHEN cancel_reason IS NULL THEN :error ELSE error END,
    cancel_reason = coalesce(cancel_reason, :reason)
WHERE id = :id;

-- name: leased_live
SELECT count(*) FROM agentlease_tasks
WHERE queue = :queue AND state = 'leased' AND expires_at > :now;

-- name: delete_tasks
-- Up to :limit tasks of the queue, in no particular order.
DELETE FROM agentlease_tasks
WHERE rowid IN (SELECT rowid FROM agentlease_tasks WHERE queue = :queue LIMIT :limit);

-- name: delete_queue
DELETE FROM agentlease_queues WHERE name = :queue;

-- name: queue_exists
SELECT 1 FROM agentlease_queues WHERE name = :queue;

-- name: queues
SELECT name FROM agentlease_queues ORDER BY name;

-- name: counts
SELECT state, count(*) FROM agentlease_tasks WHERE queue = :queue GROUP BY state;

-- name: oldest_queued
SELECT min(created_at) FROM agentlease_tasks WHERE queue = :queue AND state = 'queued';

-- name: hot_partitions
-- The five partitions with the most parked tasks, most first, ties by name (through the parked
-- index: only parked tasks are visited).
SELECT partition, count(*) AS n FROM agentlease_tasks
WHERE queue = :queue AND state = 'parked'
GROUP BY partition ORDER BY n DESC, partition LIMIT 5;

-- name: inspect
SELECT id, attempt, leased_at, expires_at, reclaims, failures, holder FROM agentlease_tasks
WHERE queue = :queue AND state = 'leased' AND expires_at > :now
ORDER BY expires_at, id LIMIT :limit;

-- name: dead
SELECT id, queue, state, priority, payload, attempt, reclaims, failures, max_reclaims,
       created_at, run_at, dedup_key, leased_at, expires_at, finished_at, progress, checkpoint,
       result, error, partition, context
FROM agentlease_tasks WHERE queue = :queue AND state = 'dead'
ORDER BY finished_at DESC, id LIMIT :limit;

-- name: dead_ids
SELECT id, seq FROM agentlease_tasks WHERE queue = :queue AND state = 'dead' ORDER BY seq;

-- name: requeue_dead
-- Parked when its partition is busy (a task requeued earlier in the same transaction counts).
UPDATE agentlease_tasks
SET state = CASE WHEN partition IS NOT NULL AND EXISTS (
        SELECT 1 FROM agentlease_tasks b
        WHERE b.queue = agentlease_tasks.queue AND b.partition = agentlease_tasks.partition
          AND b.state IN ('scheduled', 'queued', 'leased', 'failed')
    ) THEN 'parked' ELSE 'queued' END,
    reclaims = 0, failures = 0, finished_at = NULL, seq = :seq, run_at = :now
WHERE id = :id AND state = 'dead';

-- name: purge_done
-- Up to :limit done tasks of the queue that finished by :cutoff, oldest first, through the
-- agentlease_done index (INDEXED BY: an error, never a scan, if it could not be used). One
-- statement: one atomic step. Deleting the row frees its id and its dedup key.
DELETE FROM agentlease_tasks WHERE id IN (
    SELECT id FROM agentlease_tasks INDEXED BY agentlease_done
    WHERE queue = :queue AND state = 'done' AND finished_at <= :cutoff
    ORDER BY finished_at LIMIT :limit
);

-- name: purge_dead
-- As purge_done, for dead letters, through the agentlease_dead index.
DELETE FROM agentlease_tasks WHERE id IN (
    SELECT id FROM agentlease_tasks INDEXED BY agentlease_dead
    WHERE queue = :queue AND state = 'dead' AND finished_at <= :cutoff
    ORDER BY finished_at LIMIT :limit
);

-- name: list_queued
-- Listings (schema version 9), one page each, through the state's partial index (INDEXED BY:
-- an error, never a scan, if it could not be used). The first page reads the index from its
-- start; a later one from the cursor's position: the rows tied with it on the index's values
-- (after it by id or seq), then the rows past them, each part a range of the index, at most
-- :limit rows each. seq comes last, for the cursor of queued tasks.
SELECT id, queue, state, priority, payload, attempt, reclaims, failures, max_reclaims,
       created_at, run_at, dedup_key, leased_at, expires_at, finished_at, progress, checkpoint,
       result, error, partition, context, seq, cancel_reason
FROM agentlease_tasks INDEXED BY agentlease_ready
WHERE queue = :queue AND state = 'queued'
ORDER BY priority DESC, seq LIMIT :limit;

-- name: list_queued_after
SELECT * FROM (
SELECT id, queue, state, priority, payload, attempt, reclaims, failures, max_reclaims,
       created_at, run_at, dedup_key, leased_at, expires_at, finished_at, progress, checkpoint,
       result, error, partition, context, seq, cancel_reason
FROM agentlease_tasks INDEXED BY agentlease_ready
WHERE queue = :queue AND state = 'queued' AND priority = :p AND seq > :s
ORDER BY seq LIMIT :limit
)
UNION ALL
SELECT * FROM (
SELECT id, queue, state, priority, payload, attempt, reclaims, failures, max_reclaims,
       created_at, run_at, dedup_key, leased_at, expires_at, finished_at, progress, checkpoint,
       result, error, partition, context, seq, cancel_reason
FROM agentlease_tasks INDEXED BY agentlease_ready
WHERE queue = :queue AND state = 'queued' AND priority < :p
ORDER BY priority DESC, seq LIMIT :limit
)
ORDER BY 4 DESC, 22 LIMIT :limit;

-- name: list_leased
SELECT id, queue, state, priority, payload, attempt, reclaims, failures, max_reclaims,
       created_at, run_at, dedup_key, leased_at, expires_at, finished_at, progress, checkpoint,
       result, error, partition, context, seq, cancel_reason
FROM agentlease_tasks INDEXED BY agentlease_leased
WHERE queue = :queue AND state = 'leased'
ORDER BY expires_at, id LIMIT :limit;

-- name: list_leased_after
SELECT * FROM (
SELECT id, queue, state, priority, payload, attempt, reclaims, failures, max_reclaims,
       created_at, run_at, dedup_key, leased_at, expires_at, finished_at, progress, checkpoint,
       result, error, partition, context, seq, cancel_reason
FROM agentlease_tasks INDEXED BY agentlease_leased
WHERE queue = :queue AND state = 'leased' AND expires_at = :at AND id > :id
ORDER BY id LIMIT :limit
)
UNION ALL
SELECT * FROM (
SELECT id, queue, state, priority, payload, attempt, reclaims, failures, max_reclaims,
       created_at, run_at, dedup_key, leased_at, expires_at, finished_at, progress, checkpoint,
       result, error, partition, context, seq, cancel_reason
FROM agentlease_tasks INDEXED BY agentlease_leased
WHERE queue = :queue AND state = 'leased' AND expires_at > :at
ORDER BY expires_at, id LIMIT :limit
)
ORDER BY 14, 1 LIMIT :limit;

-- name: list_done
SELECT id, queue, state, priority, payload, attempt, reclaims, failures, max_reclaims,
       created_at, run_at, dedup_key, leased_at, expires_at, finished_at, progress, checkpoint,
       result, error, partition, context, seq, cancel_reason
FROM agentlease_tasks INDEXED BY agentlease_done
WHERE queue = :queue AND state = 'done'
ORDER BY finished_at DESC, id DESC LIMIT :limit;

-- name: list_done_after
SELECT * FROM (
SELECT id, queue, state, priority, payload, attempt, reclaims, failures, max_reclaims,
       created_at, run_at, dedup_key, leased_at, expires_at, finished_at, progress, checkpoint,
       result, error, partition, context, seq, cancel_reason
FROM agentlease_tasks INDEXED BY agentlease_done
WHERE queue = :queue AND state = 'done' AND finished_at = :at AND id < :id
ORDER BY id DESC LIMIT :limit
)
UNION ALL
SELECT * FROM (
SELECT id, queue, state, priority, payload, attempt, reclaims, failures, max_reclaims,
       created_at, run_at, dedup_key, leased_at, expires_at, finished_at, progress, checkpoint,
       result, error, partition, context, seq, cancel_reason
FROM agentlease_tasks INDEXED BY agentlease_done
WHERE queue = :queue AND state = 'done' AND finished_at < :at
ORDER BY finished_at DESC, id DESC LIMIT :limit
)
ORDER BY 15 DESC, 1 DESC LIMIT :limit;

-- name: list_dead
SELECT id, queue, state, priority, payload, attempt, reclaims, failures, max_reclaims,
       created_at, run_at, dedup_key, leased_at, expires_at, finished_at, progress, checkpoint,
       result, error, partition, context, seq, cancel_reason
FROM agentlease_tasks INDEXED BY agentlease_dead
WHERE queue = :queue AND state = 'dead'
ORDER BY finished_at DESC, id DESC LIMIT :limit;

-- name: list_dead_after
SELECT * FROM (
SELECT id, queue, state, priority, payload, attempt, reclaims, failures, max_reclaims,
       created_at, run_at, dedup_key, leased_at, expires_at, finished_at, progress, checkpoint,
       result, error, partition, context, seq, cancel_reason
FROM agentlease_tasks INDEXED BY agentlease_dead
WHERE queue = :queue AND state = 'dead' AND finished_at = :at AND id < :id
ORDER BY id DESC LIMIT :limit
)
UNION ALL
SELECT * FROM (
SELECT id, queue, state, priority, payload, attempt, reclaims, failures, max_reclaims,
       created_at, run_at, dedup_key, leased_at, expires_at, finished_at, progress, checkpoint,
       result, error, partition, context, seq, cancel_reason
FROM agentlease_tasks INDEXED BY agentlease_dead
WHERE queue = :queue AND state = 'dead' AND finished_at < :at
ORDER BY finished_at DESC, id DESC LIMIT :limit
)
ORDER BY 15 DESC, 1 DESC LIMIT :limit;

-- name: purge_cancelled
-- As purge_done, for cancelled tasks, through the agentlease_cancelled index.
DELETE FROM agentlease_tasks WHERE id IN (
    SELECT id FROM agentlease_tasks INDEXED BY agentlease_cancelled
    WHERE queue = :queue AND state = 'cancelled' AND finished_at <= :cutoff
    ORDER BY finished_at LIMIT :limit
);

-- name: list_cancelled
SELECT id, queue, state, priority, payload, attempt, reclaims, failures, max_reclaims,
       created_at, run_at, dedup_key, leased_at, expires_at, finished_at, progress, checkpoint,
       result, error, partition, context, seq, cancel_reason
FROM agentlease_tasks INDEXED BY agentlease_cancelled
WHERE queue = :queue AND state = 'cancelled'
ORDER BY finished_at DESC, id DESC LIMIT :limit;

-- name: list_cancelled_after
SELECT * FROM (
SELECT id, queue, state, priority, payload, attempt, reclaims, failures, max_reclaims,
       created_at, run_at, dedup_key, leased_at, expires_at, finished_at, progress, checkpoint,
       result, error, partition, context, seq, cancel_reason
FROM agentlease_tasks INDEXED BY agentlease_cancelled
WHERE queue = :queue AND state = 'cancelled' AND finished_at = :at AND id < :id
ORDER BY id DESC LIMIT :limit
)
UNION ALL
SELECT * FROM (
SELECT id, queue, state, priority, payload, attempt, reclaims, failures, max_reclaims,
       created_at, run_at, dedup_key, leased_at, expires_at, finished_at, progress, checkpoint,
       result, error, partition, context, seq, cancel_reason
FROM agentlease_tasks INDEXED BY agentlease_cancelled
WHERE queue = :queue AND state = 'cancelled' AND finished_at < :at
ORDER BY finished_at DESC, id DESC LIMIT :limit
)
ORDER BY 15 DESC, 1 DESC LIMIT :limit;

-- name: key_row
SELECT key, state, fingerprint, fence, holder, expires_at, result, error, created_at,
       finished_at, purge_at
FROM agentlease_keys WHERE key = :key;

-- name: key_reserve
-- Inserts an absent key (fence 1), or takes a present one when it is past its window (a new
-- action: only the fence carries over) or in flight with its lease run out and either the same
-- fingerprint or no token (released). Returns nothing when the key stays as it was.
INSERT INTO agentlease_keys
    (key, state, fingerprint, token, fence, holder, expires_at, created_at, purge_at)
VALUES
    (:key, 'in_flight', :fingerprint, lower(hex(randomblob(16))), 1, :holder, :expires_at, :now,
     :purge_at)
ON CONFLICT (key) DO UPDATE
SET state = 'in_flight', fingerprint = excluded.fingerprint, token = excluded.token,
    fence = fence + 1, holder = excluded.holder, expires_at = excluded.expires_at,
    result = NULL, error = NULL, finished_at = NULL, purge_at = excluded.purge_at,
    created_at = CASE WHEN purge_at <= :now THEN :now ELSE created_at END
WHERE purge_at <= :now
   OR (state = 'in_flight' AND expires_at <= :now
       AND (fingerprint = excluded.fingerprint OR token IS NULL))
RETURNING token, fence;

-- name: key_insert
-- key_reserve for a key that was absent or past its window when last read (a new action): the
-- same insert, taking a present row only if it is past its window. Returns nothing when the key
-- is live (another attempt got there first): key_reserve decides then.
INSERT INTO agentlease_keys
    (key, state, fingerprint, token, fence, holder, expires_at, created_at, purge_at)
VALUES
    (:key, 'in_flight', :fingerprint, lower(hex(randomblob(16))), 1, :holder, :expires_at, :now,
     :purge_at)
ON CONFLICT (key) DO UPDATE
SET state = 'in_flight', fingerprint = excluded.fingerprint, token = excluded.token,
    fence = fence + 1, holder = excluded.holder, expires_at = excluded.expires_at,
    result = NULL, error = NULL, finished_at = NULL, purge_at = excluded.purge_at,
    created_at = excluded.created_at
WHERE purge_at <= :now
RETURNING token, fence;

-- name: key_extend
-- The dedup window keeps its distance from the in-flight lease, and never shrinks.
UPDATE agentlease_keys
SET expires_at = :now + :hold_for,
    purge_at = max(purge_at, (:now + :hold_for) + (purge_at - expires_at))
WHERE key = :key AND token = :token AND state = 'in_flight' AND purge_at > :now
RETURNING expires_at;

-- name: key_finish
UPDATE agentlease_keys
SET state = :state, result = :result, error = :error, finished_at = :now, token = NULL,
    holder = '', expires_at = NULL, purge_at = :now + :window
WHERE key = :key AND token = :token AND state = 'in_flight' AND purge_at > :now
RETURNING fence;

-- name: key_release
UPDATE agentlease_keys
SET token = NULL, holder = '', expires_at = :now
WHERE key = :key AND token = :token AND state = 'in_flight' AND purge_at > :now
RETURNING fence;

-- name: key_fence
-- Why a fenced key write was refused.
SELECT fence, state FROM agentlease_keys WHERE key = :key AND purge_at > :now;

-- name: key_get
SELECT key, state, fingerprint, fence, holder, expires_at, result, error, created_at,
       finished_at, purge_at
FROM agentlease_keys WHERE key = :key AND purge_at > :now;

-- name: key_purge
-- Oldest first through the purge_at index: live keys are never visited.
DELETE FROM agentlease_keys
WHERE rowid IN (SELECT rowid FROM agentlease_keys WHERE purge_at <= :now
                ORDER BY purge_at LIMIT :limit);

-- name: record_get
-- One statement, so one snapshot: the record's row and all of its fields (one row with a NULL
-- field when it has none, nothing when it was never written).
SELECT r.version, r.fence, r.updated_at, f.field, f.value
FROM agentlease_records r LEFT JOIN agentlease_record_fields f ON f.key = r.key
WHERE r.key = :key;

-- name: record_put
INSERT INTO agentlease_records (key, version, fence, updated_at)
VALUES (:key, :version, :fence, :now)
ON CONFLICT (key) DO UPDATE
SET version = excluded.version, fence = excluded.fence, updated_at = excluded.updated_at;

-- name: record_bump
-- A record that exists (read in the same transaction): its new version, fence and time.
UPDATE agentlease_records SET version = :version, fence = :fence, updated_at = :now
WHERE key = :key;

-- name: record_drop_fields
-- A replacing write: the fields of the record (read in the same transaction) it does not set.
DELETE FROM agentlease_record_fields
WHERE key = :key AND field IN (SELECT value FROM json_each(:fields));

-- name: record_set_field
INSERT INTO agentlease_record_fields (key, field, value) VALUES (:key, :field, :value)
ON CONFLICT (key, field) DO UPDATE SET value = excluded.value;

-- name: record_update_field
-- A field the record has (read in the same transaction).
UPDATE agentlease_record_fields SET value = :value WHERE key = :key AND field = :field;

-- name: counter_set
-- Every change of a counter's value goes through here, so its version rises with each.
INSERT INTO agentlease_counters (name, value, version) VALUES (:name, :value, 1)
ON CONFLICT (name) DO UPDATE SET value = excluded.value, version = version + 1;

-- name: counter_version
SELECT version FROM agentlease_counters WHERE name = :name;

-- name: plan_secret_make
INSERT OR IGNORE INTO agentlease_plan_secret (id, secret) VALUES (1, :secret);

-- name: plan_secret_get
SELECT secret FROM agentlease_plan_secret WHERE id = 1;

-- name: plan_receipt_get
-- A receipt past purge_at counts as absent, whether or not purge_state has deleted it yet.
SELECT approved_by, approved_at, versions FROM agentlease_plan_receipts
WHERE id = :id AND purge_at > :now;

-- name: plan_receipt_put
INSERT INTO agentlease_plan_receipts (id, approved_by, approved_at, versions, purge_at)
VALUES (:id, :approved_by, :approved_at, :versions, :purge_at)
ON CONFLICT (id) DO UPDATE SET approved_by = excluded.approved_by,
    approved_at = excluded.approved_at, versions = excluded.versions, purge_at = excluded.purge_at;

-- name: plan_receipt_purge
DELETE FROM agentlease_plan_receipts WHERE id IN (
    SELECT id FROM agentlease_plan_receipts INDEXED BY agentlease_plan_receipts_purge
    WHERE purge_at <= :now ORDER BY purge_at LIMIT :limit
);

-- name: record_version
SELECT version FROM agentlease_records WHERE key = :key;

-- name: counter_get
-- The value as a sweep would leave it: without the units of the counter's expired holds.
SELECT value - (SELECT coalesce(sum(units), 0) FROM agentlease_counter_holds
                WHERE name = :name AND expires_at <= :now)
FROM agentlease_counters WHERE name = :name;

-- name: counter_read
SELECT value FROM agentlease_counters WHERE name = :name;

-- name: counter_sweep
-- The counter's expired holds, deleted; the caller takes their units out of the counter.
DELETE FROM agentlease_counter_holds WHERE name = :name AND expires_at <= :now
RETURNING units;

-- name: hold_units
SELECT units FROM agentlease_counter_holds WHERE name = :name AND token = :token;

-- name: hold_insert
INSERT INTO agentlease_counter_holds (name, token, units, expires_at)
VALUES (:name, :token, :units, :expires_at);

-- name: hold_extend
UPDATE agentlease_counter_holds SET expires_at = :expires_at
WHERE name = :name AND token = :token AND expires_at > :now;

-- name: hold_end
DELETE FROM agentlease_counter_holds WHERE name = :name AND token = :token
RETURNING units;

-- name: budget_purge
DELETE FROM agentlease_budgets WHERE key IN (
    SELECT key FROM agentlease_budgets INDEXED BY agentlease_budgets_expiry
    WHERE expires_at <= :now ORDER BY expires_at LIMIT :limit
);

-- name: breaker_purge
DELETE FROM agentlease_breakers WHERE key IN (
    SELECT key FROM agentlease_breakers INDEXED BY agentlease_breakers_expiry
    WHERE expires_at <= :now ORDER BY expires_at LIMIT :limit
);

-- name: budget_get
SELECT calls, retries, expires_at FROM agentlease_budgets WHERE key = :key;

-- name: budget_put
INSERT INTO agentlease_budgets (key, calls, retries, expires_at)
VALUES (:key, :calls, :retries, :expires_at)
ON CONFLICT (key) DO UPDATE SET
    calls = excluded.calls, retries = excluded.retries, expires_at = excluded.expires_at;

-- name: breaker_get
SELECT state, failures, fence, until, expires_at FROM agentlease_breakers WHERE key = :key;

-- name: breaker_put
INSERT INTO agentlease_breakers (key, state, failures, fence, until, expires_at)
VALUES (:key, :state, :failures, :fence, :until, :expires_at)
ON CONFLICT (key) DO UPDATE SET
    state = excluded.state, failures = excluded.failures, fence = excluded.fence,
    until = excluded.until, expires_at = excluded.expires_at;

-- name: locks_busy
-- The locks of the set held by another owner with a live lease.
SELECT name, owner, expires_at FROM agentlease_locks
WHERE name IN (SELECT value FROM json_each(:names))
  AND owner IS NOT NULL AND owner <> :owner AND expires_at > :now;

-- name: locks_take
-- Every lock of the set, for :owner, fence + 1 (a new lock starts at 1).
INSERT INTO agentlease_locks (name, owner, expires_at, fence)
SELECT value, :owner, :expires_at, 1 FROM json_each(:names) WHERE true
ON CONFLICT (name) DO UPDATE
SET owner = excluded.owner, expires_at = excluded.expires_at, fence = fence + 1
RETURNING name, fence;

-- name: lock_take
-- A set of one lock: take it for :owner if it is free (no owner, :owner itself, or its lease ran
-- out), fence + 1 (a new lock starts at 1); returns nothing when another owner holds it.
INSERT INTO agentlease_locks AS l (name, owner, expires_at, fence)
VALUES (:name, :owner, :expires_at, 1)
ON CONFLICT (name) DO UPDATE
SET owner = excluded.owner, expires_at = excluded.expires_at, fence = l.fence + 1
WHERE l.owner IS NULL OR l.owner = :owner OR l.expires_at <= :now
RETURNING fence;

-- name: lock_holder
SELECT owner, expires_at FROM agentlease_locks WHERE name = :name;

-- name: lock_release
UPDATE agentlease_locks SET owner = NULL, expires_at = NULL
WHERE name = :name AND owner = :owner AND expires_at > :now
RETURNING name;

-- name: locks_extend
UPDATE agentlease_locks SET expires_at = :expires_at
WHERE name IN (SELECT value FROM json_each(:names))
  AND owner = :owner AND expires_at > :now
RETURNING name;

-- name: locks_release
UPDATE agentlease_locks SET owner = NULL, expires_at = NULL
WHERE name IN (SELECT value FROM json_each(:names))
  AND owner = :owner AND expires_at > :now
RETURNING name;

-- name: locks_holders
SELECT name, owner, expires_at FROM agentlease_locks
WHERE name IN (SELECT value FROM json_each(:names))
  AND owner IS NOT NULL AND expires_at > :now;

-- name: locks_sweep
-- Soonest expiry first through the partial index: live and free locks are never visited.
UPDATE agentlease_locks SET owner = NULL, expires_at = NULL
WHERE name IN (SELECT name FROM agentlease_locks
               WHERE owner IS NOT NULL AND expires_at <= :now
               ORDER BY expires_at LIMIT :limit);

-- name: worker_sweep
-- At most 100 lapsed entries, through the expiry index.
DELETE FROM agentlease_workers
WHERE id IN (SELECT id FROM agentlease_workers WHERE expires_at <= :now LIMIT 100);

-- name: worker_register
INSERT INTO agentlease_workers (id, info, beat_at, expires_at)
VALUES (:id, :info, :now, :expires_at)
ON CONFLICT (id) DO UPDATE
SET info = excluded.info, beat_at = excluded.beat_at, expires_at = excluded.expires_at;

-- name: workers
SELECT id, info, beat_at, expires_at FROM agentlease_workers
WHERE expires_at > :now ORDER BY id;

-- name: worker_unregister
DELETE FROM agentlease_workers WHERE id = :id;
