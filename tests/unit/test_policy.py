"""Pure policy, no store: lease arithmetic, sequence numbers, backoff and retry decisions.

These functions take ``now`` and state and return a decision, so they are tested as properties
over many generated inputs rather than by example only.
"""

from __future__ import annotations

import dataclasses
import random
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentlease import InvalidDuration, InvalidInput, QueueSettings, RetryPolicy, full_jitter
from agentlease._policy.lease import FRONT_OFFSET, front_seq, is_live, lease_expiry, reap_outcome

times = st.floats(min_value=0.0, max_value=1e10, allow_nan=False, allow_infinity=False)
durations = st.floats(min_value=1e-6, max_value=1e7, allow_nan=False, allow_infinity=False)
offsets = st.floats(min_value=-1e7, max_value=1e7, allow_nan=False, allow_infinity=False)
seqs = st.integers(min_value=0, max_value=FRONT_OFFSET - 1)


# -- lease arithmetic ----------------------------------------------------------------------------


@given(
    now=times,
    lease_for=durations,
    deadline_in=offsets,
    progressed_ago=st.floats(min_value=0, max_value=1e7),
    progress_timeout=st.none() | durations,
)
def test_lease_expiry_never_passes_a_deadline(
    now, lease_for, deadline_in, progressed_ago, progress_timeout
):
    deadline = now + deadline_in
    progressed_at = now - progressed_ago
    expiry = lease_expiry(now, lease_for, deadline, progressed_at, progress_timeout)
    assert expiry <= now + lease_for
    assert expiry <= deadline
    bounds = [now + lease_for, deadline]
    if progress_timeout is not None:
        assert expiry <= progressed_at + progress_timeout
        bounds.append(progressed_at + progress_timeout)
    # ... and it is the latest time that honours them all: nothing is cut short for no reason.
    assert expiry == min(bounds)


@given(now=times, lease_for=durations, total=durations)
def test_lease_expiry_without_limits_in_reach_is_now_plus_lease(now, lease_for, total):
    deadline = now + lease_for + total
    assert lease_expiry(now, lease_for, deadline, now, None) == now + lease_for
    assert lease_expiry(now, lease_for, deadline, now, lease_for + total) == now + lease_for


@given(now=times, short=durations, extra=durations, deadline_in=offsets)
def test_lease_expiry_grows_with_the_lease_asked_for(now, short, extra, deadline_in):
    deadline = now + deadline_in
    assert lease_expiry(now, short, deadline, now, None) <= lease_expiry(
        now, short + extra, deadline, now, None
    )


@given(claimed=times, lease_for=durations, max_total=durations, beats=st.lists(durations))
def test_heartbeats_never_extend_past_the_total_deadline(claimed, lease_for, max_total, beats):
    deadline = claimed + max_total
    now = claimed
    expiry = lease_expiry(now, lease_for, deadline, claimed, None)
    for gap in beats:
        now += gap
        if not is_live(now, expiry):
            break
        expiry = lease_expiry(now, lease_for, deadline, claimed, None)
        assert expiry <= deadline


@given(claimed=times, lease_for=durations, timeout=durations, beats=st.lists(durations))
def test_heartbeats_without_progress_never_pass_the_progress_deadline(
    claimed, lease_for, timeout, beats
):
    now = claimed
    for gap in beats:
        now += gap
        assert lease_expiry(now, lease_for, float("inf"), claimed, timeout) <= claimed + timeout


@given(now=times, delta=st.floats(min_value=1e-3, max_value=1e6))
def test_a_lease_is_live_strictly_before_its_expiry(now, delta):
    assert is_live(now, now + delta)
    assert not is_live(now, now)  # at the instant of expiry it is gone
    assert not is_live(now + delta, now)


@given(reclaims=st.integers(0, 1000), max_reclaims=st.integers(0, 1000))
def test_reap_outcome_dead_only_past_the_budget(reclaims, max_reclaims):
    expected = "dead" if reclaims > max_reclaims else "requeued"
    assert reap_outcome(reclaims, max_reclaims) == expected


@given(max_reclaims=st.integers(0, 50))
def test_a_task_survives_exactly_max_reclaims_expiries(max_reclaims):
    outcomes = [reap_outcome(n, max_reclaims) for n in range(1, max_reclaims + 3)]
    assert outcomes.count("requeued") == max_reclaims
    assert outcomes[max_reclaims] == "dead"
    assert outcomes[max_reclaims + 1] == "dead"


# -- sequence numbers: the front of a priority -----------------------------------------------------


@given(a=seqs, b=seqs)
def test_front_seq_goes_ahead_of_every_unmoved_task(a, b):
    assert front_seq(a) < b
    assert front_seq(a) < 0


@given(a=seqs, b=seqs)
def test_front_seq_keeps_the_order_among_front_tasks(a, b):
    if a < b:
        assert front_seq(a) < front_seq(b)
    if a != b:
        assert front_seq(a) != front_seq(b)


@given(a=seqs)
def test_front_seq_is_idempotent(a):
    assert front_seq(front_seq(a)) == front_seq(a)


@given(
    waiting=st.lists(seqs, unique=True, min_size=1, max_size=30),
    data=st.data(),
)
def test_sorting_by_seq_puts_front_tasks_first_in_their_own_order(waiting, data):
    moved = set(data.draw(st.lists(st.sampled_from(waiting), unique=True)))
    keys = {s: front_seq(s) if s in moved else s for s in waiting}
    order = sorted(waiting, key=keys.__getitem__)
    assert order == sorted(moved) + sorted(set(waiting) - moved)


# -- backoff ---------------------------------------------------------------------------------------


def ceiling(retry: int, base: float, cap: float) -> float:
    return cap if retry >= 64 else min(cap, base * 2**retry)


@given(
    retry=st.integers(0, 10_000),
    base=st.floats(min_value=1e-3, max_value=1e3),
    cap=st.floats(min_value=1e-3, max_value=1e5),
    seed=st.integers(),
)
def test_full_jitter_stays_within_its_bound(retry, base, cap, seed):
    delay = full_jitter(retry, base=base, cap=cap, rand=random.Random(seed))
    assert 0.0 <= delay <= ceiling(retry, base, cap)
    # A seeded stream reproduces the delay.
    assert full_jitter(retry, base=base, cap=cap, rand=random.Random(seed)) == delay


@given(retry=st.integers(0, 100))
def test_full_jitter_without_a_stream_stays_within_its_bound(retry):
    assert 0.0 <= full_jitter(retry, base=0.5, cap=30.0) <= ceiling(retry, 0.5, 30.0)


@pytest.mark.parametrize(("retry", "bound"), [(0, 1.0), (3, 8.0), (10, 60.0), (500, 60.0)])
def test_full_jitter_spreads_over_the_whole_range(retry, bound):
    rand = random.Random(7)
    delays = [full_jitter(retry, base=1.0, cap=60.0, rand=rand) for _ in range(4000)]
    assert max(delays) <= bound
    assert min(delays) < 0.02 * bound  # full jitter: down to zero, not "base plus noise"
    assert max(delays) > 0.98 * bound
    assert statistics.fmean(delays) == pytest.approx(bound / 2, rel=0.05)


# -- retry decisions -------------------------------------------------------------------------------


class Fatal(Exception):
    pass


class MoreFatal(Fatal):
    pass


@given(max_failures=st.integers(1, 20), failures=st.integers(0, 30), seed=st.integers())
def test_retry_policy_dead_letters_at_max_failures(max_failures, failures, seed):
    policy = RetryPolicy(max_failures=max_failures, base=0.5, cap=10.0)
    delay = policy.retry_in(failures, ValueError("flaky"), random.Random(seed))
    if failures + 1 >= max_failures:
        assert delay is None
    else:
        assert delay is not None
        assert 0.0 <= delay <= ceiling(failures, 0.5, 10.0)


@given(max_failures=st.integers(1, 20))
def test_retry_policy_allows_exactly_max_failures_attempts(max_failures):
    policy = RetryPolicy(max_failures=max_failures)
    failures = 0
    while policy.retry_in(failures, RuntimeError("again"), random.Random(failures)) is not None:
        failures += 1
        assert failures < 100
    assert failures + 1 == max_failures


@given(failures=st.integers(0, 5))
def test_non_retryable_errors_dead_letter_at_once(failures):
    policy = RetryPolicy(max_failures=10, non_retryable=(Fatal, KeyError))
    assert policy.retry_in(failures, Fatal("no")) is None
    assert policy.retry_in(failures, MoreFatal("subclass too")) is None
    assert policy.retry_in(failures, KeyError("k")) is None
    assert policy.retry_in(failures, ValueError("retryable")) is not None


def test_retry_policy_defaults_are_bounded():
    policy = RetryPolicy()
    assert 1 <= policy.max_failures <= 10
    assert policy.cap < float("inf")
    assert policy.non_retryable == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.max_failures = 100  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_failures": 0}, InvalidInput),
        ({"max_failures": -1}, InvalidInput),
        ({"max_failures": 1.5}, InvalidInput),
        ({"max_failures": True}, InvalidInput),
        ({"base": 0}, InvalidDuration),
        ({"base": float("nan")}, InvalidDuration),
        ({"cap": -1.0}, InvalidDuration),
        ({"cap": float("inf")}, InvalidDuration),
    ],
)
def test_retry_policy_refuses_bad_settings(kwargs, error):
    with pytest.raises(error):
        RetryPolicy(**kwargs)


# -- queue settings --------------------------------------------------------------------------------


def test_queue_settings_make_lease_terms():
    settings = QueueSettings(lease_for=10.0, max_lease=100.0, progress_timeout=20.0)
    terms = settings.terms()
    assert (terms.lease_for, terms.max_total, terms.progress_timeout, terms.reap_front) == (
        10.0,
        100.0,
        20.0,
        True,
    )
    assert settings.terms(3.0).lease_for == 3.0
    assert QueueSettings(reap_front=False).terms().reap_front is False


def test_queue_settings_defaults_are_bounded():
    settings = QueueSettings()
    assert 0 < settings.lease_for <= settings.max_lease < float("inf")
    assert 0 <= settings.max_reclaims < 100
    assert 0 < settings.max_payload_bytes <= 64 * 1024 * 1024
