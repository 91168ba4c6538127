"""The dashboard's rates: net change of the done and dead counts per minute between samples."""

from __future__ import annotations

import pytest

from agentlease.dashboard._rates import RateMeter


def test_no_rate_until_two_samples_are_far_enough_apart() -> None:
    meter = RateMeter(window=60, min_span=5)
    assert meter.rate("q") is None
    assert meter.observe("q", 100.0, {"done": 0}) is None
    assert meter.observe("q", 102.0, {"done": 4}) is None
    rate = meter.observe("q", 110.0, {"done": 20, "dead": 1})
    assert rate is not None
    assert rate.span == pytest.approx(10.0)
    assert rate.per_minute == {"done": pytest.approx(120.0), "dead": pytest.approx(6.0)}


def test_the_rate_is_over_the_last_window_of_samples() -> None:
    meter = RateMeter(window=60, min_span=5)
    for second in range(0, 181, 10):
        rate = meter.observe("q", 1000.0 + second, {"done": second * 2 if second < 120 else 240})
    assert rate is not None
    assert rate.span == pytest.approx(60.0)
    assert rate.per_minute["done"] == pytest.approx(0.0)  # nothing done in the last minute


def test_sparse_samples_give_a_rate_over_their_real_span() -> None:
    meter = RateMeter(window=60, min_span=5)
    meter.observe("q", 0.0, {"done": 0})
    rate = meter.observe("q", 300.0, {"done": 50})
    assert rate is not None
    assert rate.span == pytest.approx(300.0)
    assert rate.per_minute["done"] == pytest.approx(10.0)


def test_a_count_that_went_down_gives_no_rate_and_queues_are_apart() -> None:
    meter = RateMeter(window=60, min_span=5)
    meter.observe("a", 0.0, {"done": 10, "dead": 3})
    meter.observe("b", 0.0, {"done": 0})
    rate = meter.observe("a", 30.0, {"done": 2, "dead": 5})  # done tasks purged
    assert rate is not None
    assert rate.per_minute == {"done": None, "dead": pytest.approx(4.0)}
    assert meter.rate("b") is None


def test_a_clock_that_goes_back_starts_again() -> None:
    meter = RateMeter(window=60, min_span=5)
    meter.observe("q", 100.0, {"done": 0})
    assert meter.observe("q", 50.0, {"done": 5}) is None
    rate = meter.observe("q", 56.0, {"done": 11})
    assert rate is not None
    assert rate.per_minute["done"] == pytest.approx(60.0)
