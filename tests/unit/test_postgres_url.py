"""``postgresql://`` URLs: what is accepted, what is refused, and what reaches libpq.

Pure parsing: no server and no driver are needed.
"""

from __future__ import annotations

import pytest

from agentlease.backends._postgres_url import PLANNER, PostgresSettings, parse
from agentlease.errors import InvalidURL


def test_defaults() -> None:
    s = parse("postgresql://app@db.example:5433/tasks")
    assert (s.schema, s.migrate, s.pool_min, s.pool_max) == ("public", True, 1, 10)
    assert (s.connect_timeout, s.pool_timeout) == (5.0, 5.0)
    assert s.conninfo == "postgresql://app@db.example:5433/tasks"
    assert s.display == s.url


def test_postgres_scheme_is_an_alias() -> None:
    s = parse("postgres://app@localhost/tasks")
    assert s.conninfo == "postgresql://app@localhost/tasks"


def test_own_options_are_parsed_and_kept_from_libpq() -> None:
    s = parse(
        "postgresql://app@localhost/tasks?schema=agents_1&migrate=false&pool_min=2&pool_max=7"
        "&connect_timeout=1.5&pool_timeout=0.5&sslmode=require&application_name=crew"
    )
    assert s == PostgresSettings(
        url=s.url,
        display=s.url,
        conninfo="postgresql://app@localhost/tasks?sslmode=require&application_name=crew",
        schema="agents_1",
        migrate=False,
        pool_min=2,
        pool_max=7,
        connect_timeout=1.5,
        pool_timeout=0.5,
    )


def test_connect_kwargs_set_search_path_autocommit_and_a_bounded_timeout() -> None:
    kwargs = parse("postgresql://h/db?schema=s1&connect_timeout=0.5").connect_kwargs()
    assert kwargs == {
        "autocommit": True,
        "connect_timeout": 2,
        "options": "-c search_path=s1 " + PLANNER,
    }
    assert parse("postgresql://h/db?connect_timeout=7.2").connect_kwargs()["connect_timeout"] == 8


@pytest.mark.parametrize("value", ["true", "1", "yes", "on", "TRUE"])
def test_migrate_true_spellings(value: str) -> None:
    assert parse(f"postgresql://h/db?migrate={value}").migrate is True


@pytest.mark.parametrize("value", ["false", "0", "no", "off", "False"])
def test_migrate_false_spellings(value: str) -> None:
    assert parse(f"postgresql://h/db?migrate={value}").migrate is False


def test_password_never_shows_in_display() -> None:
    s = parse("postgresql://app:s3cr%40t@localhost:5432/tasks?schema=a&password=other")
    assert "s3cr" not in s.display
    assert "other" not in s.display
    assert "app:***@localhost:5432" in s.display
    assert "s3cr%40t" in s.conninfo  # libpq still gets it


@pytest.mark.parametrize(
    ("url", "conninfo"),
    [
        pytest.param(
            "postgresql:///test?host=/var/run/postgresql&schema=s",
            "postgresql:///test?host=%2Fvar%2Frun%2Fpostgresql",
            id="socket-in-query",
        ),
        pytest.param(
            "postgresql://app@%2Fvar%2Frun%2Fpostgresql/test?schema=s",
            "postgresql://app@%2Fvar%2Frun%2Fpostgresql/test",
            id="socket-percent-encoded-host",
        ),
        pytest.param("postgresql:///test", "postgresql:///test", id="empty-host-default-socket"),
        pytest.param("postgres://app@/test", "postgresql://app@/test", id="user-empty-host"),
        pytest.param("postgresql://app@:5433/test", "postgresql://app@:5433/test", id="port-only"),
        pytest.param("postgresql://", "postgresql://", id="all-defaults"),
        pytest.param(
            "postgresql://app@h1:5432,h2:5433/test?target_session_attrs=read-write",
            "postgresql://app@h1:5432,h2:5433/test?target_session_attrs=read-write",
            id="several-hosts",
        ),
        pytest.param(
            "postgresql://app@[::1]:5432/test", "postgresql://app@[::1]:5432/test", id="ipv6"
        ),
    ],
)
def test_libpq_host_forms_reach_libpq_intact(url: str, conninfo: str) -> None:
    """libpq's forms of a Unix socket or an empty host keep the "//" that makes them a URL."""
    s = parse(url)
    assert s.conninfo == conninfo
    assert s.with_schema("other").conninfo == conninfo
    assert s.with_schema("other").display.split("?")[0] == s.display.split("?")[0]
    assert "://" in s.display


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:s3cret@%2Fvar%2Frun%2Fpostgresql/test",
        "postgresql://app:s3cret@/test?host=/tmp",
        "postgresql:///test?host=/tmp&password=s3cret",
        "postgresql:///test?user=app&sslpassword=s3cret&password=s3cret",
        "postgresql://app:s3cret@h1:5432,h2:5433/test",
    ],
)
def test_passwords_are_masked_in_every_host_form(url: str) -> None:
    s = parse(url)
    for shown in (s.display, s.with_schema("other").display, repr(s), str(s)):
        assert "s3cret" not in shown, shown
    assert "***" in s.display
    assert "s3cret" in s.conninfo  # libpq still gets it


def test_pool_max_follows_a_large_pool_min() -> None:
    assert parse("postgresql://h/db?pool_min=20").pool_max == 20


def test_with_schema() -> None:
    s = parse("postgresql://h/db?schema=a&pool_max=3").with_schema("b")
    assert (s.schema, s.pool_max) == ("b", 3)


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("postgresql://h/db?colour=blue", id="unknown-option"),
        pytest.param("postgresql://h/db?options=-c%20x%3D1", id="libpq-options-are-ours"),
        pytest.param("postgresql://h/db?schema=a&schema=b", id="option-twice"),
        pytest.param("postgresql://h/db?schema", id="option-without-value"),
        pytest.param("postgresql://h/db?schema=", id="empty-schema"),
        pytest.param("postgresql://h/db?schema=Agents", id="uppercase-schema"),
        pytest.param("postgresql://h/db?schema=a-b", id="dash-in-schema"),
        pytest.param("postgresql://h/db?schema=1abc", id="schema-starts-with-digit"),
        pytest.param("postgresql://h/db?schema=pg_catalog", id="reserved-schema"),
        pytest.param("postgresql://h/db?schema=" + "s" * 64, id="schema-too-long"),
        pytest.param('postgresql://h/db?schema=a"b', id="quote-in-schema"),
        pytest.param("postgresql://h/db?schema=a;drop", id="injection-in-schema"),
        pytest.param("postgresql://h/db?migrate=maybe", id="bad-migrate"),
        pytest.param("postgresql://h/db?pool_min=-1", id="negative-pool-min"),
        pytest.param("postgresql://h/db?pool_max=0", id="zero-pool-max"),
        pytest.param("postgresql://h/db?pool_max=1.5", id="float-pool-max"),
        pytest.param("postgresql://h/db?pool_min=5&pool_max=2", id="min-over-max"),
        pytest.param("postgresql://h/db?connect_timeout=0", id="zero-timeout"),
        pytest.param("postgresql://h/db?connect_timeout=nan", id="nan-timeout"),
        pytest.param("postgresql://h/db?connect_timeout=inf", id="inf-timeout"),
        pytest.param("postgresql://h/db?pool_timeout=soon", id="word-timeout"),
        pytest.param("postgresql://h:port/db", id="bad-port"),
        pytest.param("postgresql://h:99999/db", id="port-out-of-range"),
        pytest.param("postgresql://h:0/db", id="port-zero"),
        pytest.param("postgresql://h1:5432,h2:x/db", id="bad-port-of-second-host"),
        pytest.param("postgresql://[::1/db", id="unclosed-ipv6"),
        pytest.param("postgresql://h/db/extra", id="two-path-parts"),
        pytest.param("postgresql://h/db#frag", id="fragment"),
        pytest.param("mysql://h/db", id="other-scheme"),
        pytest.param("", id="empty"),
    ],
)
def test_refused(url: str) -> None:
    with pytest.raises(InvalidURL):
        parse(url)


def test_refused_non_string() -> None:
    with pytest.raises(InvalidURL):
        parse(None)  # type: ignore[arg-type]


def test_connect_dispatches_postgres_urls_and_checks_them_first() -> None:
    import agentlease as al

    for url in ("postgresql://h/db?nope=1", "postgres://h/db?schema=UP"):
        with pytest.raises(InvalidURL):
            al.connect(url)
        with pytest.raises(InvalidURL):
            al.connect_async(url)


def test_the_settings_repr_never_shows_the_password() -> None:
    settings = parse("postgresql://alice:s3cret-pw@127.0.0.1:5432/test?schema=app")
    assert "s3cret-pw" not in repr(settings)
    assert "s3cret-pw" not in settings.display
