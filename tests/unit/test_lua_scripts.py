"""The Redis backend's scripts as they are sent: helpers, field positions and headers."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

from agentlease.backends import lua


def test_field_names_are_sent_as_numbers() -> None:
    for script in lua.SCRIPTS.values():
        text = script.text.decode()
        assert not re.search(r"\bF_[A-Z]+\b", text), script.name
        assert "-- helpers here:" not in text, script.name


def test_helpers_of_a_rare_branch_are_made_only_in_it() -> None:
    text = lua.SCRIPTS["claim"].text.decode()
    top, body = text.split("-- claim.lua\n")
    assert "local function save_head(" in top
    assert "local function reap(" not in top
    branch = body.index("if woke then")
    assert body.index("local function reap(") > branch
    assert body.index("local function make_ready(") > branch


def test_a_script_may_not_declare_a_field_name(tmp_path: Path) -> None:
    source = resources.files("agentlease.backends.lua")
    for name in [*lua.NAMES, *(lib.removesuffix(".lua") for lib in lua.LIBS)]:
        (tmp_path / f"{name}.lua").write_text(source.joinpath(f"{name}.lua").read_text())
    assert lua._load(tmp_path).keys() == lua.SCRIPTS.keys()
    get = tmp_path / "get.lua"
    get.write_text(get.read_text() + "local F_STATE = 1\n")
    with pytest.raises(RuntimeError, match=r"get\.lua declares F_STATE"):
        lua._load(tmp_path)


QUEUE_SCRIPTS = [n for n in lua.NAMES if hasattr(lua.queue_keys("p", "q"), n)]


@pytest.mark.parametrize("name", QUEUE_SCRIPTS)
def test_each_header_lists_the_keys_the_script_is_given(name: str) -> None:
    body = resources.files("agentlease.backends.lua").joinpath(f"{name}.lua").read_text()
    header = re.search(r"^-- KEYS:(.*?)^-- ARGV:", body, re.MULTILINE | re.DOTALL)
    assert header is not None
    numbers = [int(n) for n in re.findall(r"\b(\d+) [a-z]", header[1])]
    given = getattr(lua.queue_keys("p", "q"), name)
    # A script run on several key lists (purge: one per finished state) takes the same number.
    for keys in given.values() if isinstance(given, dict) else [given]:
        assert numbers == list(range(1, len(keys) + 1))
        assert all(key.startswith("{p:q}:") for key in keys)


@pytest.mark.parametrize("name", [n for n in lua.NAMES if n not in QUEUE_SCRIPTS])
def test_every_other_header_numbers_its_keys_from_one(name: str) -> None:
    body = resources.files("agentlease.backends.lua").joinpath(f"{name}.lua").read_text()
    header = re.search(r"^-- KEYS:(.*?)^-- ARGV:", body, re.MULTILINE | re.DOTALL)
    assert header is not None
    numbers = [int(n) for n in re.findall(r"\b(\d+) [a-z]", header[1])]
    assert numbers == list(range(1, len(numbers) + 1))
    assert numbers
