"""Least privilege, tested: agentlease works under exactly the rights ``agentlease rights``
prints, and one right less is a typed, immediate refusal that names what is missing.

A private ``redis-server`` gets one ACL user made from :func:`agentlease._rights.rights` for the
URL's prefix; a private PostgreSQL (one per module) gets the administrator's statements, the
schema migrated by the owner role with ``agentlease migrate``, and the owner's grants to the
worker role. Then, as that user or role only: a real ``agentlease worker`` process runs tasks
whose handler records an idempotent action and adds to a guarded counter; every primitive of the
queue, the idempotency keys and the guards runs on the sync face (``_workload.exercise``) and the
asyncio face. Then one right is taken away at a time (a command a script calls, a command the
client sends, a key pattern; EXECUTE on a function, UPDATE on a table, USAGE on the schema): the
call raises :class:`~agentlease.errors.PermissionDenied` (permanent, never the transient
BackendUnavailable that callers wait out) naming the command, key pattern, table, function or
schema, within the connect timeout, and a worker exits with status 2 and that message instead
of retrying.

Every right of the printed rule is needed (each one's removal was seen to fail the workload
when the rule was written); these tests take away a representative few, so that they stay fast.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import redis
from click.testing import CliRunner

import agentlease as al
from agentlease._records import PlanRead, PlanReceipt, PlanWrite, RecordWrite
from agentlease._rights import PostgresGrants, RedisRule, rights
from agentlease.backends.memory import MemoryBackend
from agentlease.cli import cli
from tests import _private_postgres
from tests._private_redis import CannotStart, PrivateRedis
from tests.conftest import unavailable
from tests.security import _handler, _workload

ROOT = Path(__file__).resolve().parents[2]
FAST = 5.0  # seconds: a refusal comes at once (the connect timeout is 3 s); generous when loaded
PASSWORD = "w0rker-secret"
PREFIX = "rights"


def _refusal(call: Callable[[], object]) -> al.PermissionDenied:
    """The PermissionDenied that ``call`` raises, at once."""
    started = time.monotonic()
    with pytest.raises(al.PermissionDenied) as caught:
        call()
    assert time.monotonic() - started < FAST, "a refusal must not wait or retry"
    assert not isinstance(caught.value, al.BackendUnavailable)
    return caught.value


def _first_call(url: str) -> None:
    """Open a client on ``url`` and make one call."""
    with al.Queue.connect(url) as queue:
        queue.queues()


def _worker(url: str, queue: str) -> subprocess.CompletedProcess[str]:
    """Run ``agentlease worker`` with the test handler on ``queue`` until it is empty."""
    argv = [sys.executable, "-m", "agentlease", "worker", f"{_handler.__name__}:handle"]
    argv += ["--backend", url, "--queue", queue, "--burst", "--concurrency", "4"]
    env = {**os.environ, "AGENTLEASE_URL": url, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def _enqueue(url: str, queue: str, n: int) -> list[str]:
    with al.Queue.connect(url) as q:
        return [e.task_id for e in q.enqueue_many(queue, list(range(n)))]


def _check_worker_ran(url: str, ids: list[str], done: subprocess.CompletedProcess[str]) -> None:
    """The worker exited by itself, every task is done, and each job's idempotent action and
    guarded counter write went through."""
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    with al.Queue.connect(url) as q:
        for i, task_id in enumerate(ids):
            task = q.get(task_id)
            assert task.state == "done"
            assert task.result == {"n": i, "sent": {"sent": i}}
    with al.SharedState.connect(url) as state:
        assert state.counter(_handler.COUNTER) >= len(ids)


# -- the rule printed, the README, the command line ----------------------------------------------


def test_the_command_line_prints_the_rights_that_the_tests_apply() -> None:
    runner = CliRunner()
    url = "postgresql://app_worker@db.example.com/app?schema=agentlease"
    out = runner.invoke(cli, ["rights", url])
    assert out.exit_code == 0, out.output
    assert out.output == rights(url).text() + "\n"
    out = runner.invoke(cli, ["rights", "redis://localhost:6379/0?prefix=jobs", "--role", "w"])
    assert out.exit_code == 0, out.output
    rule = rights("redis://localhost:6379/0?prefix=jobs", role="w")
    assert out.output == rule.text() + "\n"
    assert "ACL SETUSER w reset on ><password> resetchannels ~jobs:* ~{jobs:* -@all " in out.output
    out = runner.invoke(cli, ["rights", "sqlite:///tasks.db"])
    assert out.exit_code == 2
    assert "redis:// or postgresql://" in out.output


def test_the_readme_shows_what_the_command_prints() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Rights (least privilege)")[1].split("\n## ")[0]
    assert "\n".join(rights("redis://localhost:6379/0").text().splitlines()[2:]) in section
    grants = rights("postgresql://app_worker@db.example.com/app?schema=agentlease")
    assert isinstance(grants, PostgresGrants)
    for statement in [*grants.admin(), *grants.worker_grants()]:
        assert statement in section, statement


def test_the_redis_rule_follows_the_url() -> None:
    rule = rights("redis://alice:pw@host:6379/3?prefix=app.jobs")
    assert isinstance(rule, RedisRule)
    assert rule.user == "alice"
    assert rule.keys == ("~app.jobs:*", "~{app.jobs:*")
    assert "select" in rule.commands  # database 3: the client sends SELECT on connecting
    assert "cluster|slots" not in rule.commands
    cluster = rights("redis://host:7000/0?cluster=1")
    assert isinstance(cluster, RedisRule)
    assert {"cluster|slots", "command"} <= set(cluster.commands)
    assert "select" not in cluster.commands
    assert "pw" not in rule.text()


def test_the_postgres_grants_follow_the_url() -> None:
    grants = rights("postgresql://localhost/app", role="user", owner="App-Owner")
    assert isinstance(grants, PostgresGrants)
    assert (grants.schema, grants.database, grants.worker) == ("public", "app", "user")
    # The public schema exists: the owner is granted CREATE in it, and only agentlease's own
    # functions lose PUBLIC's EXECUTE (other software's functions may live there too).
    assert 'GRANT USAGE, CREATE ON SCHEMA public TO "App-Owner";' in grants.admin()
    assert "ALL FUNCTIONS" not in grants.text()
    assert 'GRANT USAGE ON SCHEMA public TO "user";' in grants.worker_grants()
    assert grants.owner_url == "postgresql://App-Owner@localhost/app"
    assert rights("postgresql://u:secret@h/db?schema=jobs").owner_url == (  # type: ignore[union-attr]
        "postgresql://agentlease_owner@h/db?schema=jobs"
    )
    for role in ("public", "agentlease_owner", "a b"):
        with pytest.raises(al.InvalidURL):
            rights("postgresql://localhost/app", role=role)


# -- what a refusal says, without a server ------------------------------------------------------


def test_a_script_command_refused_by_the_acl_is_named() -> None:
    from redis import exceptions as rx

    from agentlease.backends import _redis_url
    from agentlease.backends.lua import SCRIPTS

    script = SCRIPTS["claim"]
    number = next(
        i + 1 for i, line in enumerate(script.text.decode().splitlines()) if "'ZPOPMIN'" in line
    )
    url = "redis://w:***@host:6379/0?prefix=jobs"
    replies = [  # Redis 7.0 and 7.1; then 7.2 on, which names the command itself
        "The user executing the script can't run this command or subcommand script: "
        f"{script.sha}, on @user_script:{number}.",
        "ACL failure in script: this user has no permissions to run the 'zpopmin' command "
        f"script: {script.sha}, on @user_script:{number}.",
    ]
    for reply in replies:
        exc = _redis_url.translate(url, rx.ResponseError(reply))
        assert type(exc) is al.PermissionDenied
        assert "the command ZPOPMIN that script 'claim' calls" in str(exc)
    keys = _redis_url.translate(
        url, rx.NoPermissionError("this user has no permissions to access one of the keys")
    )
    assert type(keys) is al.PermissionDenied
    assert "~jobs:* and ~{jobs:*" in str(keys)


def test_a_postgres_privilege_refused_is_named_and_only_migrating_mentions_create() -> None:
    from psycopg import errors as pe

    from agentlease.backends._postgres_driver import translate
    from agentlease.backends._postgres_url import parse

    settings = parse("postgresql://app_worker@db/app?schema=jobs")
    cases = {
        "permission denied for table agentlease_keys": "SELECT, INSERT, UPDATE, DELETE on "
        "table jobs.agentlease_keys",
        "permission denied for function agentlease_extend": "EXECUTE on function "
        "jobs.agentlease_extend",
        "permission denied for sequence agentlease_seq": "USAGE on sequence jobs.agentlease_seq",
        "permission denied for schema jobs": "USAGE on schema 'jobs'",
    }
    for detail, named in cases.items():
        exc = translate(settings, pe.InsufficientPrivilege(detail))
        assert type(exc) is al.PermissionDenied
        assert named in str(exc)
        assert "CREATE" not in str(exc)
    exc = translate(
        settings, pe.InsufficientPrivilege("permission denied for schema jobs"), migrating=True
    )
    assert "CREATE on schema 'jobs'" in str(exc)


# -- Redis ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateRedis]:
    """A private Redis whose default user administers the ACL users of these tests."""
    try:
        server = PrivateRedis(tmp_path_factory.mktemp("redis-rights")).start()
    except CannotStart as exc:
        unavailable("private redis-server", exc.reason)
    try:
        yield server
    finally:
        server.stop()


@dataclass
class RedisACL:
    """The private server, and how to set the worker's ACL user on it."""

    server: PrivateRedis

    def url(self, prefix: str = PREFIX) -> str:
        return f"redis://worker:{PASSWORD}@127.0.0.1:{self.server.port}/0?prefix={prefix}"

    def rule(self) -> RedisRule:
        rule = rights(self.url())
        assert isinstance(rule, RedisRule)
        return rule

    def set(self, *, without: str | None = None) -> str:
        """Give the user exactly the printed rule (less the rule ``without``); return its URL.
        The server forgets its scripts, so that the first call of each is sent whole (EVAL)."""
        rules = self.rule().rules(PASSWORD)
        if without is not None:
            assert without in rules
            rules.remove(without)
        admin = redis.Redis(port=self.server.port)
        try:
            admin.execute_command("ACL", "SETUSER", self.rule().user, *rules)
            admin.execute_command("SCRIPT", "FLUSH")
        finally:
            admin.close()
        return self.url()


@pytest.fixture
def redis_acl(redis_server: PrivateRedis) -> RedisACL:
    acl = RedisACL(redis_server)
    acl.set()
    return acl


def test_redis_workload_runs_under_exactly_the_rule(redis_acl: RedisACL) -> None:
    url = redis_acl.url()
    _workload.exercise(url)
    _workload.run_async(url)
    other = redis_acl.url(prefix="other")  # another prefix's keys are out of reach
    assert "~other:*" in str(_refusal(lambda: _first_call(other)))


def test_redis_plans_run_under_exactly_the_rule(redis_acl: RedisACL) -> None:
    """The plan primitives (the store's secret, a counter's version, an act that applies, one
    that is stale, one replayed) need no right beyond the printed rule; without SET, which their
    scripts call, the refusal names it."""
    from agentlease._records import PlanRead, PlanReceipt, PlanWrite, RecordWrite

    url = redis_acl.url()
    space = f"plans-{time.monotonic_ns()}"
    order, refunds = f"{space}|order", f"{space}|refunds"
    backend = al.connect(url)
    try:
        assert len(backend.plan_secret()) == 32
        backend.add_counter(refunds, 1, None, None)
        assert backend.get_counter_version(refunds) == (1, 1)
        reads = [PlanRead("record", order, 0), PlanRead("counter", refunds, 1)]
        writes = [
            PlanWrite("record", order, record=RecordWrite({"s": b'"refunded"'})),
            PlanWrite("counter", refunds, delta=1, high=10),
        ]
        done = backend.act_plan("plan-1", reads, writes, "ada", 60, None)
        assert isinstance(done, PlanReceipt)
        assert done.first
        again = backend.act_plan("plan-1", reads, writes, "ada", 60, None)
        assert isinstance(again, PlanReceipt)
        assert not again.first
        stale = backend.act_plan("plan-2", reads, writes, "ada", 60, None)
        assert isinstance(stale, list)
        assert [s.key for s in stale] == [order, refunds]
    finally:
        backend.close()
    less = redis_acl.set(without="+set")
    backend = al.connect(less)
    try:
        assert "SET" in str(_refusal(backend.plan_secret))
    finally:
        backend.close()
        redis_acl.set()


def test_redis_rule_for_another_database_adds_select(redis_server: PrivateRedis) -> None:
    acl = RedisACL(redis_server)
    url = acl.url().replace("/0?", "/1?")
    rule = rights(url)
    assert isinstance(rule, RedisRule)
    admin = redis.Redis(port=redis_server.port)
    try:
        admin.execute_command("ACL", "SETUSER", rule.user, *rule.rules(PASSWORD))
        _first_call(url)  # SELECT 1 on connecting
        less = [r for r in rule.rules(PASSWORD) if r != "+select"]
        admin.execute_command("ACL", "SETUSER", rule.user, *less)
        assert "SELECT" in str(_refusal(lambda: _first_call(url)))
    finally:
        admin.close()
        acl.set()


def test_redis_worker_process_runs_under_exactly_the_rule(redis_acl: RedisACL) -> None:
    url = redis_acl.url()
    ids = _enqueue(url, "rights-worker", 20)
    _check_worker_ran(url, ids, _worker(url, "rights-worker"))


@pytest.mark.parametrize(
    ("without", "named"),
    [
        ("+hset", "HSET"),  # called by the scripts (and sent by the client)
        ("+zadd", "ZADD"),  # called by the scripts only
        ("+evalsha", "EVALSHA"),  # every primitive
        ("+time", "TIME"),  # called by the scripts: the store's clock
        (f"~{{{PREFIX}:*", f"~{{{PREFIX}:*"),  # the keys of queues and locks
    ],
)
def test_redis_one_right_less_is_a_permission_error_naming_it(
    redis_acl: RedisACL, without: str, named: str
) -> None:
    url = redis_acl.set(without=without)

    def enqueue() -> None:
        with al.Queue.connect(url) as queue:
            queue.enqueue("rights-less", {"n": 1})

    async def enqueue_async() -> None:
        async with al.AsyncQueue.connect(url) as queue:
            await queue.enqueue("rights-less", {"n": 1})

    for exc in (_refusal(enqueue), _refusal(lambda: asyncio.run(enqueue_async()))):
        assert named in str(exc), exc
        assert "agentlease rights" in str(exc)
        assert PASSWORD not in str(exc)


def test_redis_worker_missing_a_right_exits_naming_it(redis_acl: RedisACL) -> None:
    url = redis_acl.url()
    _enqueue(url, "rights-stop", 3)
    url = redis_acl.set(without="+zpopmin")  # claim's pick
    done = _worker(url, "rights-stop")
    assert done.returncode == 2, done.stderr
    assert "ZPOPMIN" in done.stderr
    assert "Traceback" not in done.stderr
    redis_acl.set()
    with al.Queue.connect(url) as q:
        assert q.stats("rights-stop").counts == {"queued": 3}  # nothing was taken


# -- PostgreSQL --------------------------------------------------------------------------------

SCHEMA = "agentlease"
WORKER = "app_worker"


@dataclass
class PG:
    """The private server, its grants, and the worker's URL."""

    server: _private_postgres.PrivatePostgres
    grants: PostgresGrants
    url: str

    def as_owner(self, statement: str) -> None:
        owner_url = self.server.url(user=self.grants.owner)
        with psycopg.connect(owner_url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(statement.encode())


@pytest.fixture(scope="module")
def pg() -> Iterator[PG]:
    """A private PostgreSQL: two roles, the schema migrated by its owner with ``agentlease
    migrate``, the worker role granted what ``agentlease rights`` prints."""
    try:
        server = _private_postgres.start()
    except _private_postgres.CannotStart as exc:
        unavailable("private postgresql", str(exc))
    try:
        url = server.url(user=WORKER, schema=SCHEMA)
        grants = rights(url)
        assert isinstance(grants, PostgresGrants)
        server.sql(f"CREATE ROLE {grants.owner} LOGIN")
        server.sql(f"CREATE ROLE {WORKER} LOGIN")
        for statement in grants.admin():
            server.sql(statement)
        migrated = CliRunner().invoke(cli, ["migrate", "--backend", grants.owner_url])
        assert migrated.exit_code == 0, migrated.output
        state = PG(server, grants, url)
        for statement in grants.worker_grants():
            state.as_owner(statement)
        yield state
    finally:
        server.stop()


def test_postgres_workload_runs_under_exactly_the_grants(pg: PG) -> None:
    _workload.exercise(pg.url)
    _workload.run_async(pg.url)


def test_postgres_worker_role_needs_no_create_and_checks_the_schema(pg: PG) -> None:
    with psycopg.connect(pg.server.url(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT has_schema_privilege(%s, %s, 'CREATE'), "
            "has_database_privilege(%s, 'postgres', 'CREATE'), "
            "(SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = %s)",
            (WORKER, SCHEMA, WORKER, SCHEMA),
        ).fetchone()
    assert row == (False, False, pg.grants.owner)
    checked = CliRunner().invoke(cli, ["migrate", "--check", "--backend", pg.url])
    assert checked.exit_code == 0, checked.output
    assert "up to date" in checked.output


def test_postgres_listen_notify_wakes_the_worker_role(pg: PG) -> None:
    with al.Queue.connect(pg.url) as queue:
        queue.enqueue("rights-wake", 0)
        woke = threading.Event()

        def wait() -> None:
            queue.backend.wait_for_work("rights-wake", 30)
            woke.set()

        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        time.sleep(0.3)  # LISTEN is in place (a late enqueue would still wake it)
        queue.enqueue("rights-wake", 1)
        waiter.join(10)
        assert woke.is_set(), "NOTIFY did not reach the worker role's LISTEN"


def test_postgres_worker_process_runs_under_exactly_the_grants(pg: PG) -> None:
    ids = _enqueue(pg.url, "rights-worker", 20)
    _check_worker_ran(pg.url, ids, _worker(pg.url, "rights-worker"))


@pytest.fixture
def revoked(pg: PG) -> Iterator[Callable[[str], None]]:
    """Revoke a privilege as the owner for one test; it is granted again afterwards."""
    undo: list[str] = []

    def revoke(statement: str) -> None:
        pg.as_owner(statement)
        undo.append(statement.replace("REVOKE", "GRANT", 1).replace(" FROM ", " TO "))

    yield revoke
    for statement in undo:
        pg.as_owner(statement)


@pytest.mark.parametrize(
    ("revoke", "named"),
    [
        (
            f"REVOKE EXECUTE ON FUNCTION {SCHEMA}.agentlease_claim_holder FROM {WORKER}",
            f"EXECUTE on function {SCHEMA}.agentlease_claim_holder",
        ),
        (  # a release's trigger records the attempt, as the role that releases
            f"REVOKE INSERT ON {SCHEMA}.agentlease_attempts FROM {WORKER}",
            f"SELECT, INSERT, UPDATE, DELETE on table {SCHEMA}.agentlease_attempts",
        ),
        (
            f"REVOKE UPDATE ON {SCHEMA}.agentlease_tasks FROM {WORKER}",
            f"SELECT, INSERT, UPDATE, DELETE on table {SCHEMA}.agentlease_tasks",
        ),
        (f"REVOKE USAGE ON SCHEMA {SCHEMA} FROM {WORKER}", f"USAGE on schema '{SCHEMA}'"),
    ],
)
def test_postgres_one_right_less_is_a_permission_error_naming_it(
    pg: PG, revoked: Callable[[str], None], revoke: str, named: str
) -> None:
    _enqueue(pg.url, "rights-less", 2)  # one for each face
    revoked(revoke)

    def claim() -> None:
        with al.Queue.connect(pg.url) as queue:
            for job in queue.claim("rights-less"):
                queue.release(job.lease)

    async def claim_async() -> None:
        async with al.AsyncQueue.connect(pg.url) as queue:
            for job in await queue.claim("rights-less"):
                await queue.release(job.lease)

    for exc in (_refusal(claim), _refusal(lambda: asyncio.run(claim_async()))):
        assert named in str(exc), exc
        assert "CREATE" not in str(exc)  # a worker is not told to migrate
        assert "agentlease rights" in str(exc)


def test_postgres_worker_missing_a_right_exits_naming_it(
    pg: PG, revoked: Callable[[str], None]
) -> None:
    _enqueue(pg.url, "rights-stop", 3)
    revoked(f"REVOKE EXECUTE ON FUNCTION {SCHEMA}.agentlease_complete_many FROM {WORKER}")
    done = _worker(pg.url, "rights-stop")
    assert done.returncode == 2, done.stderr
    assert f"EXECUTE on function {SCHEMA}.agentlease_complete_many" in done.stderr
    assert "Traceback" not in done.stderr


def _plan(url: str, name: str, *, pin: str | None = None) -> tuple[object, object]:
    """Every plan primitive on the sync face: the secret, a counter's version, and a plan that
    reads an absent record (its stand-in row is deleted), a counter and optionally a pin, and
    writes a record and the counter; then the same plan again (its receipt replayed)."""
    backend = al.connect(url)
    try:
        assert len(backend.plan_secret()) == 32
        assert backend.get_counter_version(f"{name}|c") == (0, 0)
        reads = [PlanRead("record", f"{name}|r", 0), PlanRead("counter", f"{name}|c", 0)]
        if pin is not None:
            reads.append(PlanRead("pin", pin, 1))
        writes = [
            PlanWrite("record", f"{name}|w", record=RecordWrite({"a": b"1"})),
            PlanWrite("counter", f"{name}|c", delta=1),
        ]
        first = backend.act_plan(f"{name}-plan", reads, writes, "ada", 60.0, None)
        again = backend.act_plan(f"{name}-plan", reads, writes, "ada", 60.0, None)
        assert backend.purge_state(10) >= 0
        return first, again
    finally:
        backend.close()


def test_postgres_plans_run_under_exactly_the_grants(pg: PG) -> None:
    pg.as_owner(
        f"CREATE TABLE IF NOT EXISTS {SCHEMA}.rights_orders (id integer PRIMARY KEY,"
        f" version bigint NOT NULL); INSERT INTO {SCHEMA}.rights_orders VALUES (1, 1)"
        f" ON CONFLICT DO NOTHING; GRANT SELECT, UPDATE ON {SCHEMA}.rights_orders TO {WORKER}"
    )
    pin = '{"column":"version","table":"rights_orders","where":{"id":1}}'
    first, again = _plan(pg.url, "rights-plan", pin=pin)
    assert isinstance(first, PlanReceipt)
    assert first.first
    assert isinstance(again, PlanReceipt)
    assert not again.first

    async def run() -> None:
        backend = al.connect_async(pg.url)
        try:
            assert len(await backend.plan_secret()) == 32
            reads = [PlanRead("record", "rights-aplan|r", 0)]
            writes = [PlanWrite("counter", "rights-aplan|c", delta=1)]
            done = await backend.act_plan("rights-aplan", reads, writes, "ada", 60.0, None)
            assert isinstance(done, PlanReceipt)
            assert await backend.get_counter_version("rights-aplan|c") == (1, 1)
        finally:
            await backend.close()

    asyncio.run(run())


@pytest.mark.parametrize(
    ("revoke", "named"),
    [
        (
            f"REVOKE EXECUTE ON FUNCTION {SCHEMA}.agentlease_act_plan FROM {WORKER}",
            f"EXECUTE on function {SCHEMA}.agentlease_act_plan",
        ),
        (
            f"REVOKE EXECUTE ON FUNCTION {SCHEMA}.agentlease_secret FROM {WORKER}",
            f"EXECUTE on function {SCHEMA}.agentlease_secret",
        ),
        (
            f"REVOKE SELECT ON {SCHEMA}.agentlease_secrets FROM {WORKER}",
            f"SELECT, INSERT on table {SCHEMA}.agentlease_secrets",
        ),
        (
            f"REVOKE INSERT ON {SCHEMA}.agentlease_plans FROM {WORKER}",
            f"SELECT, INSERT, UPDATE, DELETE on table {SCHEMA}.agentlease_plans",
        ),
        (  # the stand-in row of an absent record read by the plan
            f"REVOKE DELETE ON {SCHEMA}.agentlease_records FROM {WORKER}",
            f"SELECT, INSERT, UPDATE, DELETE on table {SCHEMA}.agentlease_records",
        ),
    ],
)
def test_postgres_plans_one_right_less_is_a_permission_error_naming_it(
    pg: PG, revoked: Callable[[str], None], revoke: str, named: str
) -> None:
    revoked(revoke)
    name = f"rights-less-{revoke.split()[2].lower()}-{time.monotonic_ns()}"
    exc = _refusal(lambda: _plan(pg.url, name))
    assert named in str(exc), exc
    assert "agentlease rights" in str(exc)


def test_postgres_migrating_without_create_says_so(pg: PG) -> None:
    url = pg.server.url(user=WORKER, schema="elsewhere")
    exc = _refusal(lambda: _first_call(url))
    assert "CREATE" in str(exc)
    assert "migrate" in str(exc)


# -- Redis Cluster -----------------------------------------------------------------------------


def test_redis_cluster_runs_under_its_rule_and_names_a_missing_right(
    redis_cluster_base: str,
) -> None:
    from redis.cluster import RedisCluster

    base = redis_cluster_base.replace("redis://", f"redis://worker:{PASSWORD}@")
    url = f"{base}&prefix={PREFIX}"
    rule = rights(url)
    assert isinstance(rule, RedisRule)
    admin = RedisCluster.from_url(redis_cluster_base)

    def set_user(without: str | None = None) -> None:
        rules = [r for r in rule.rules(PASSWORD) if r != without]
        admin.execute_command("ACL", "SETUSER", "worker", *rules, target_nodes=admin.ALL_NODES)

    try:
        set_user()
        _workload.exercise(url)
        set_user(without="+cluster|slots")  # read by the client before its first call
        exc = _refusal(lambda: _first_call(url))
        assert "CLUSTER SLOTS" in str(exc)
    finally:
        admin.execute_command("ACL", "DELUSER", "worker", target_nodes=admin.ALL_NODES)
        admin.close()


# -- a final write refused for good ---------------------------------------------------------------


class RefusesFailures(MemoryBackend):
    """A store on which the worker may claim and complete, but not record a failure."""

    def fail(self, lease: al.Lease, error_json: bytes, retry_in: float | None) -> al.Task:
        raise al.PermissionDenied("the role lacks UPDATE for failures")


def test_a_worker_stops_when_the_store_refuses_a_final_write_for_good() -> None:
    queue = al.Queue(RefusesFailures())
    queue.enqueue_many("q", [1, 2])

    def handler(ctx: al.JobContext) -> al.JSON:
        raise ValueError("the handler fails; recording it is refused")

    worker = al.Worker(queue, "q", handler)
    with pytest.raises(al.PermissionDenied, match="lacks UPDATE for failures"):
        worker.run(handle_signals=False)  # not burst: without the stop it would run on
