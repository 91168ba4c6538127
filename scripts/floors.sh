#!/usr/bin/env bash
# The Redis and PostgreSQL contract tests once more, on the oldest driver versions that
# pyproject.toml declares (redis, hiredis, psycopg, psycopg-binary, psycopg-pool pinned to
# their ">=" floors), in a venv of their own: a floor that is declared is a floor that is tested.
# The same for the other extras: the dashboard (starlette, uvicorn, jinja2), cron schedules
# (cronsim), OpenTelemetry (opentelemetry-api, and the SDK the tests use) and the Prometheus
# endpoint (opentelemetry-exporter-prometheus, prometheus-client) run their tests on their floors
# too, and the documentation site (mkdocs, mkdocstrings, mkdocstrings-python, mkdocs-material) is
# built on its floors.
#
# The venv ($AGENTLEASE_FLOORS_VENV, default /tmp/agentlease-floors-venv) is reused while the
# requirements it was built from are unchanged. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${AGENTLEASE_FLOORS_VENV:-/tmp/agentlease-floors-venv}"

# Every dependency of agentlease and of its test extra, the drivers pinned to their floors.
requirements="$(python - <<'PY'
import re
import tomllib

FLOORS = {"redis", "hiredis", "psycopg", "psycopg-binary", "psycopg-pool", "starlette", "uvicorn",
          "jinja2", "cronsim", "opentelemetry-api", "opentelemetry-sdk",
          "opentelemetry-exporter-prometheus", "prometheus-client", "mkdocs", "mkdocstrings",
          "mkdocstrings-python", "mkdocs-material"}
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
lines = [*project["dependencies"], *extras["redis"], *extras["postgres"], *extras["dashboard"],
         *extras["cron"], *extras["otel"], *extras["prometheus"], *extras["docs"],
         *extras["test"]]
lines = [line for line in lines if not line.startswith("agentlease")] + ["hatchling", "editables"]
out, pinned = [], set()
for line in lines:
    match = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?(.*)", line.replace(" ", ""))
    name, extra, spec = match.groups()
    if name.lower() in FLOORS:
        floor = re.fullmatch(r">=([0-9][0-9.]*(?:[ab][0-9]+)?)", spec)
        if floor is None:
            raise SystemExit(f"{line!r}: a driver needs one '>=' floor in pyproject.toml")
        pinned_line = f"{name}=={floor.group(1)}"  # the extra's packages are listed on their own
        if pinned_line not in out:  # a floor that two extras declare
            out.append(pinned_line)
        pinned.add(name.lower())
    else:
        out.append(line)
if pinned != FLOORS:
    raise SystemExit(f"pyproject.toml declares no floor for {sorted(FLOORS - pinned)}")
print("\n".join(out))
PY
)"

if [[ ! -x "$venv/bin/python" ]] || [[ "$(cat "$venv/floors.txt" 2>/dev/null)" != "$requirements" ]]; then
    rm -rf "$venv"
    python -m venv "$venv"
    "$venv/bin/python" -m pip install -q -r /dev/stdin <<<"$requirements"
    printf '%s' "$requirements" >"$venv/floors.txt"
fi
# This checkout (the venv may have been built from another one); its dependencies are above.
"$venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e .
FLOORED="redis|hiredis|psycopg|psycopg-binary|psycopg-pool|starlette|uvicorn|jinja2|cronsim"
FLOORED+="|opentelemetry-api|opentelemetry-sdk|opentelemetry-exporter-prometheus|prometheus.client"
FLOORED+="|mkdocs|mkdocstrings|mkdocstrings-python|mkdocs-material"
"$venv/bin/python" -m pip list 2>/dev/null | grep -iE "^($FLOORED) "

# Every contract test of Redis, Redis Cluster and PostgreSQL (claim, complete, extend, reap,
# keys, records, counters, locks, partitions) except those that only refuse bad input before any
# I/O and the timing races, which test the stores, not the drivers: a few minutes at most.
# AGENTLEASE_FLOORS_STORES narrows the stores ("redis" takes Redis Cluster too; "postgres").
export AGENTLEASE_REQUIRE_SERVICES=1
stores="${AGENTLEASE_FLOORS_STORES:-redis or postgres}"
# The dashboard's HTTP tests, the schedules' tests (tick arithmetic, cron), the metrics and
# traces tests, the Prometheus endpoint's and the documentation site's strict build on their
# floors.
"$venv/bin/python" -m pytest tests/integration/test_dashboard.py tests/unit/test_schedule.py \
    tests/integration/test_otel.py tests/integration/test_prometheus.py tests/unit/test_docs.py \
    -q -p no:cacheprovider -k "memory or sqlite or not (redis or postgres)" "$@"
exec "$venv/bin/python" -m pytest tests/contract -q -p no:cacheprovider \
    -k "($stores) and not bad_ and not refuses_non_json and not look_like_json and not holder_write_races and not faults_never" "$@"
