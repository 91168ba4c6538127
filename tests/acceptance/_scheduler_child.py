"""The schedules of tests/acceptance/test_scheduler_processes.py, run by the command line::

    AGENTLEASE_TEST_START=... AGENTLEASE_TEST_END=... \
        python -m agentlease scheduler --backend URL tests/acceptance/_scheduler_child.py:SCHEDULES

One schedule: a tick every second from START (included) to END (excluded), on the store's clock,
catching up every tick of the last GRACE seconds, so a scheduler that starts late, or survives
the others, fires what they left.
"""

from __future__ import annotations

import os

import agentlease as al

QUEUE = "ticks"
GRACE = 15.0

SCHEDULES = [
    al.Schedule(
        "beat",
        QUEUE,
        every=1.0,
        payload={"what": "beat"},
        misfire="all",
        grace=GRACE,
        start=float(os.environ.get("AGENTLEASE_TEST_START", "0")),
        end=float(os.environ.get("AGENTLEASE_TEST_END", "1")),
    )
]
