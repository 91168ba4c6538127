"""Store URLs in messages: passwords and key files masked, even in URLs that cannot be parsed."""

from __future__ import annotations

import pytest

import agentlease as al
from agentlease._redact import redact_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://u:p4ss@h:1/0", "redis://u:***@h:1/0"),
        ("redis://:p4ss@h", "redis://:***@h"),
        ("redis://h:6379/0?prefix=a", "redis://h:6379/0?prefix=a"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("postgresql://u@h/db?password=p4ss&schema=s", "postgresql://u@h/db?password=***&schema=s"),
        (
            "rediss://h/0?ssl_keyfile=/k/p4ss.pem&ssl_ca_certs=/ca",
            "rediss://h/0?ssl_keyfile=***&ssl_ca_certs=/ca",
        ),
        ("postgresql://h/db?sslkey=/k/p4ss.key", "postgresql://h/db?sslkey=***"),
        # A password holding '/', '?' or '@' unescaped: the user part ends at the last '@'.
        ("redis://u:p4/ss@h/0", "redis://u:***@h/0"),
        ("redis://u:p4?s@s@h/0", "redis://u:***@h/0"),
        ("not a url u:p4ss@x", "not a url u:***@x"),
    ],
)
def test_secrets_are_masked(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert "p4" not in redact_url(url)


def test_what_is_not_a_string_is_shown_by_type() -> None:
    assert redact_url(b"redis://u:p4ss@h") == "<bytes>"


@pytest.mark.parametrize(
    "url",
    [
        "redis://u:p4/ss@h/0",
        "postgresql://u:p4/ss@h/db",
        "redis://u:p4ss@h:99999/0",
        "postgresql://u:p4ss@h:99999/db",
        "redis://u:p4ss@h/0?prefix=a\nb",
        "postgresql://u:p4ss@h/db?schema=a\tb",
        "sqlite://u:p4ss@h/x.db",
        "mysql://u:p4ss@h/db",
        "redis://u:p4ss@h/0?bogus=1",
        "postgresql://u:p4ss@h/db?bogus=1",
    ],
)
def test_refused_urls_never_quote_the_password(url: str) -> None:
    for open_ in (al.connect, al.connect_async):
        with pytest.raises(al.InvalidURL) as caught:
            open_(url)
        assert "p4" not in str(caught.value)
        assert caught.value.__cause__ is None or "p4" not in str(caught.value.__cause__)
