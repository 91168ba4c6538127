"""How psycopg's errors become agentlease's: what retrying cannot fix is BackendRefused.

A refused connection carries no SQLSTATE in psycopg, so the words of libpq and the server decide;
these are the messages they send (PostgreSQL 12 to 17, libpq 15+). No server is needed.
"""

from __future__ import annotations

import psycopg
import pytest

from agentlease.backends._postgres_driver import translate
from agentlease.backends._postgres_url import parse
from agentlease.errors import (
    AuthenticationFailed,
    BackendError,
    BackendRefused,
    BackendUnavailable,
    PermissionDenied,
    SchemaNotMigrated,
    TLSRefused,
)

SETTINGS = parse("postgresql://app:s3cret@db.example:5432/tasks?schema=agents")
AT = 'connection failed: connection to server at "10.0.0.5", port 5432 failed: FATAL:  '


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        (AT + 'password authentication failed for user "app"', AuthenticationFailed),
        (AT + 'role "app" does not exist', AuthenticationFailed),
        (AT + 'role "app" is not permitted to log in', AuthenticationFailed),
        (
            AT + 'no pg_hba.conf entry for host "10.0.0.9", user "app", database "tasks"',
            AuthenticationFailed,
        ),
        (AT + 'Peer authentication failed for user "app"', AuthenticationFailed),
        ("connection failed: fe_sendauth: no password supplied", AuthenticationFailed),
        (AT + 'database "tasks" does not exist', BackendRefused),
        (AT + 'permission denied for database "tasks"', PermissionDenied),
        (AT + "sorry, too many clients already", BackendUnavailable),
        (AT + "the database system is starting up", BackendUnavailable),
        (AT + "the database system is shutting down", BackendUnavailable),
        (
            'connection failed: connection to server at "10.0.0.5", port 5432 failed: '
            "Connection refused",
            BackendUnavailable,
        ),
    ],
)
def test_connection_failures(message: str, kind: type[BackendError]) -> None:
    translated = translate(SETTINGS, psycopg.OperationalError(message))
    assert type(translated) is kind
    assert "s3cret" not in str(translated)
    assert "postgresql://app:***@db.example:5432/tasks" in str(translated)


FAILED = 'connection failed: connection to server at "10.0.0.5", port 5432 failed: '


@pytest.mark.parametrize(
    ("message", "words"),
    [
        (FAILED + "SSL error: certificate verify failed", "could not be verified"),
        (
            FAILED + 'server certificate for "db.internal" does not match host name "db.example"',
            "host name does not match",
        ),
        (AT + "connection requires a valid client certificate", "requires a client certificate"),
        (FAILED + "SSL error: tlsv1 alert unknown ca", "does not trust the client certificate"),
        (
            FAILED + 'root certificate file "/etc/ca.crt" does not exist',
            "sslrootcert) cannot be read",
        ),
        (FAILED + "server does not support SSL, but SSL was required", "does not offer TLS"),
    ],
)
def test_tls_failures_are_permanent_and_say_why(message: str, words: str) -> None:
    translated = translate(SETTINGS, psycopg.OperationalError(message))
    assert type(translated) is TLSRefused
    assert words in str(translated)
    assert "s3cret" not in str(translated)


def test_a_broken_tls_connection_stays_transient() -> None:
    message = FAILED + "SSL SYSCALL error: EOF detected"
    assert type(translate(SETTINGS, psycopg.OperationalError(message))) is BackendUnavailable


E = psycopg.errors


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (E.UndefinedTable('relation "agentlease_tasks" does not exist'), SchemaNotMigrated),
        (E.InvalidSchemaName('schema "agents" does not exist'), SchemaNotMigrated),
        (E.InsufficientPrivilege("permission denied for schema agents"), PermissionDenied),
        (E.InvalidPassword("password authentication failed"), AuthenticationFailed),
        (E.InvalidCatalogName('database "tasks" does not exist'), BackendRefused),
    ],
)
def test_server_errors(error: Exception, kind: type[BackendError]) -> None:
    assert type(translate(SETTINGS, error)) is kind


def test_permanent_and_transient_do_not_overlap() -> None:
    assert not issubclass(BackendRefused, BackendUnavailable)
    assert not issubclass(BackendUnavailable, BackendRefused)
    for cls in (AuthenticationFailed, PermissionDenied, SchemaNotMigrated):
        assert issubclass(cls, BackendRefused)
