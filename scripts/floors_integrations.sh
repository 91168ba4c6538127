#!/usr/bin/env bash
# The integrations (the MCP server and proxy, the OpenAI Agents SDK, LangGraph and Pydantic AI
# adapters: tests/integrations) on the floors pyproject.toml declares for their extras, in a venv
# of their own: the frameworks pin versions of starlette, pydantic and httpx that the drivers'
# floors venv (scripts/floors.sh, starlette at the dashboard's floor) cannot hold beside them.
#
# The venv ($AGENTLEASE_INTEGRATION_FLOORS_VENV, default /tmp/agentlease-integration-floors-venv)
# is reused while the requirements it was built from are unchanged. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${AGENTLEASE_INTEGRATION_FLOORS_VENV:-/tmp/agentlease-integration-floors-venv}"

# agentlease's own dependencies and its test tools as declared; each framework at its floor.
requirements="$(python - <<'PY'
import re
import tomllib

EXTRAS = ("mcp", "openai-agents", "langgraph", "pydantic-ai")
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
out = []
for extra in EXTRAS:
    for line in extras[extra]:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?>=([0-9][0-9.]*(?:[ab][0-9]+)?)", line)
        if match is None:
            raise SystemExit(f"{line!r}: an integration needs one '>=' floor in pyproject.toml")
        name, extra_part, floor = match.groups()
        out.append(f"{name}{extra_part or ''}=={floor}")
# The stores' drivers (the tests run on SQLite, Redis and PostgreSQL) and the test tools.
keep = ("redis", "hiredis", "psycopg", "pytest", "hypothesis", "cryptography")
for line in [*project["dependencies"], *extras["redis"], *extras["postgres"], *extras["test"]]:
    name = re.match(r"[A-Za-z0-9_.-]+", line).group(0)
    if not line.startswith("agentlease") and (line in project["dependencies"] or
                                              name.startswith(keep)):
        out.append(line)
print("\n".join([*out, "hatchling", "editables"]))
PY
)"

if [[ ! -x "$venv/bin/python" ]] || [[ "$(cat "$venv/floors.txt" 2>/dev/null)" != "$requirements" ]]; then
    rm -rf "$venv"
    python -m venv "$venv"
    "$venv/bin/python" -m pip install -q -r /dev/stdin <<<"$requirements"
    printf '%s' "$requirements" >"$venv/floors.txt"
fi
"$venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e .
"$venv/bin/python" -m pip list 2>/dev/null | grep -iE "^(mcp|openai-agents|langgraph|pydantic-ai-slim) "

export AGENTLEASE_REQUIRE_SERVICES=1
exec "$venv/bin/python" -m pytest tests/integrations tests/unit/test_error_body.py -q \
    -p no:cacheprovider "$@"
