-- Named queries of the SQLite backend. Parameters are named (:name); times are seconds since the
-- epoch on this machine's clock, read inside the transaction that uses them.

-- name: schema
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
    error            BLOB
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
CREATE UNIQUE INDEX IF NOT EXISTS agentlease_dedup
    ON agentlease_tasks (queue, dedup_key) WHERE dedup_key IS NOT NULL;

-- name: bump_seq
INSERT INTO agentlease_queues (name, seq) VALUES (:queue, :count)
ON CONFLICT (name) DO UPDATE SET seq = seq + :count
RETURNING seq;

-- name: insert_task
INSERT OR IGNORE INTO agentlease_tasks
    (id, queue, state, priority, seq, payload, dedup_key, max_reclaims, created_at, run_at)
VALUES
    (:id, :queue, :state, :priority, :seq, :payload, :dedup_key, :max_reclaims, :now, :run_at);

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
SELECT id, attempt, reclaims, max_reclaims, seq FROM agentlease_tasks
WHERE queue = :queue AND state = 'leased' AND expires_at <= :now;

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
    progress_timeout = :progress_timeout, progressed_at = :now
WHERE id IN (SELECT id FROM agentlease_tasks
             WHERE queue = :queue AND state = 'queued'
             ORDER BY priority DESC, seq LIMIT :n)
RETURNING id, token, attempt, payload, checkpoint, priority, failures, reclaims, seq;

-- name: extend
-- The new expiry is agentlease._policy.lease.lease_expiry, written in SQL.
UPDATE agentlease_tasks
SET expires_at = min(:now + :lease_for, lease_deadline,
                     coalesce(progressed_at + progress_timeout, 1e308))
FROM (SELECT value ->> 0 AS lid, value ->> 1 AS ltoken FROM json_each(:leases))
WHERE id = lid AND token = ltoken AND state = 'leased' AND expires_at > :now
RETURNING id, token, expires_at;

-- name: complete
UPDATE agentlease_tasks
SET state = 'done', result = :result, finished_at = :now, token = NULL, expires_at = NULL
WHERE id = :id AND token = :token AND state = 'leased' AND expires_at > :now;

-- name: fail_retry
UPDATE agentlease_tasks
SET state = 'failed', failures = failures + 1, error = :error, run_at = :now + :retry_in,
    token = NULL, expires_at = NULL
WHERE id = :id AND token = :token AND state = 'leased' AND expires_at > :now
RETURNING id, queue, state, priority, payload, attempt, reclaims, failures, max_reclaims,
          created_at, run_at, dedup_key, leased_at, expires_at, finished_at, progress, checkpoint,
          result, error;

-- name: fail_dead
UPDATE agentlease_tasks
SET state = 'dead', failures = failures + 1, error = :error, finished_at = :now,
    token = NULL, expires_at = NULL
WHERE id = :id AND token = :token AND state = 'leased' AND expires_at > :now
RETURNING id, queue, state, priority, payload, attempt, reclaims, failures, max_reclaims,
          created_at, run_at, dedup_key, leased_at, expires_at, finished_at, progress, checkpoint,
          result, error;

-- name: release
UPDATE agentlease_tasks
SET state = 'queued', token = NULL, expires_at = NULL,
    seq = CASE WHEN :front THEN (CASE WHEN seq >= 0 THEN seq - :offset ELSE seq END) ELSE :seq END
WHERE id = :id AND token = :token AND state = 'leased' AND expires_at > :now;

-- name: progress
UPDATE agentlease_tasks
SET progress = :progress, checkpoint = coalesce(:checkpoint, checkpoint), progressed_at = :now
WHERE id = :id AND token = :token AND state = 'leased' AND expires_at > :now;

-- name: fence_state
SELECT attempt, state, token, expires_at FROM agentlease_tasks WHERE id = :id;

-- name: get
SELECT id, queue, state, priority, payload, attempt, reclaims, failures, max_reclaims,
       created_at, run_at, dedup_key, leased_at, expires_at, finished_at, progress, checkpoint,
       result, error
FROM agentlease_tasks WHERE id = :id;

-- name: queue_exists
SELECT 1 FROM agentlease_queues WHERE name = :queue;

-- name: queues
SELECT name FROM agentlease_queues ORDER BY name;

-- name: counts
SELECT state, count(*) FROM agentlease_tasks WHERE queue = :queue GROUP BY state;

-- name: oldest_queued
SELECT min(created_at) FROM agentlease_tasks WHERE queue = :queue AND state = 'queued';

-- name: inspect
SELECT id, attempt, leased_at, expires_at, reclaims, failures FROM agentlease_tasks
WHERE queue = :queue AND state = 'leased' AND expires_at > :now
ORDER BY expires_at, id LIMIT :limit;

-- name: dead
SELECT id, queue, state, priority, payload, attempt, reclaims, failures, max_reclaims,
       created_at, run_at, dedup_key, leased_at, expires_at, finished_at, progress, checkpoint,
       result, error
FROM agentlease_tasks WHERE queue = :queue AND state = 'dead'
ORDER BY finished_at DESC, id LIMIT :limit;

-- name: dead_ids
SELECT id, seq FROM agentlease_tasks WHERE queue = :queue AND state = 'dead';

-- name: requeue_dead
UPDATE agentlease_tasks
SET state = 'queued', reclaims = 0, failures = 0, finished_at = NULL, seq = :seq
WHERE id = :id AND state = 'dead';
