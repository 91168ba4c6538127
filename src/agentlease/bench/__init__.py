"""``agentlease bench``: the library's throughput and per-call costs beside raw baselines.

Loaded only by the ``bench`` command (see :mod:`agentlease.cli._app`), never by ``import
agentlease`` nor by ``agentlease worker``, except :mod:`~agentlease.bench.noop_handler`: the
handler of the worker processes the bench starts. :mod:`~agentlease.bench.command` is the
command and the throughput rows; :mod:`~agentlease.bench.loops` the claim/complete loops on
SQLite and memory, :mod:`~agentlease.bench.keys` and :mod:`~agentlease.bench.guards` the
idempotency and guard rows, :mod:`~agentlease.bench.redis_rows`,
:mod:`~agentlease.bench.redis_link` and :mod:`~agentlease.bench.postgres_rows` the served
stores, :mod:`~agentlease.bench.served` the dispatch to them, and
:mod:`~agentlease.bench.workers` the worker row: real ``agentlease worker`` processes beside the
raw loop in as many processes.
"""
