"""The ``keys`` commands: look at one idempotency key, and purge keys past the dedup window."""

from __future__ import annotations

import click
from rich.markup import escape

from agentlease._codec import JSON
from agentlease._policy.keys import check_key
from agentlease._records import KeyRecord
from agentlease.cli._app import backend_option, cli, console, new_table, reports_errors
from agentlease.cli.admin import open_queue, print_json

__all__ = ["keys"]


def _key_json(record: KeyRecord) -> dict[str, JSON]:
    left = None if record.expires_at is None else round(record.expires_at - record.now, 3)
    return {
        "key": record.key,
        "state": record.state,
        "fence": record.fence,
        "holder": record.holder,
        "in_flight_for": left,
        "fingerprint": record.fingerprint,
        "result": record.result,
        "error": record.error,
        "age": round(record.now - record.created_at, 3),
        "purged_in": round(record.purge_at - record.now, 3),
    }


@cli.group()
def keys() -> None:
    """Idempotency keys: show one, purge those past the dedup window."""


@keys.command()
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@backend_option
@reports_errors
def show(key: str, as_json: bool, url: str) -> None:
    """The stored state of KEY: in flight (held by whom, for how long), done or failed."""
    q = open_queue(url, must_exist=True)
    try:
        record = q.backend.get_key(check_key(key))
    finally:
        q.close()
    if record is None:
        if as_json:
            print_json(None)
        else:
            console.print(f"no key [bold]{escape(key)}[/] (never used, or past its dedup window)")
        return
    info = _key_json(record)
    if as_json:
        print_json(info)
        return
    table = new_table(title=f"idempotency key {escape(key[:16])}...", show_header=False)
    for name, value in info.items():
        table.add_row(name, "-" if value is None else escape(str(value)))
    console.print(table)


@keys.command()
@click.option("--limit", type=click.IntRange(1, 1_000_000), default=10_000, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a line.")
@backend_option
@reports_errors
def purge(limit: int, as_json: bool, url: str) -> None:
    """Delete keys past their dedup window now (Redis expires them by itself)."""
    q = open_queue(url, must_exist=True)
    try:
        count = q.backend.purge_keys(limit)
    finally:
        q.close()
    if as_json:
        print_json({"purged": count})
        return
    console.print(f"purged {count} keys")
