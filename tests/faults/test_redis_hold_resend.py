"""Counter holds on Redis when a reply is lost: the link sends the script again, and the hold's
token (and the tombstone a release or commit leaves) makes the second sending change nothing."""

from __future__ import annotations

import agentlease as al
from tests.faults.test_redis_restart import _apply_then_drop


def test_hold_release_and_commit_whose_reply_was_lost_apply_once(served_url_redis: str) -> None:
    with al.SharedState.connect(served_url_redis) as state:
        state.reserve("seats", 2, limit=10)
        dropped = _apply_then_drop(state.backend)
        with state.hold("seats", 3, limit=10, ttl=30) as held:  # applied, reply lost, resent
            assert len(dropped) == 1
            assert held.value == 5
            assert state.counter("seats") == 5, "held once"
            dropped = _apply_then_drop(state.backend)
            held.release()  # applied, reply lost, resent: answered as released
            assert len(dropped) == 1
        assert state.counter("seats") == 2, "given back once"

        with state.hold("seats", 4, limit=10, ttl=30) as held:
            dropped = _apply_then_drop(state.backend)
            held.commit()  # applied, reply lost, resent: answered as committed
            assert len(dropped) == 1
        assert state.counter("seats") == 6, "taken for good, once"
