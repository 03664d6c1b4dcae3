"""course_lib.time_side_by_side: warm-up untimed, rounds interleaved, seconds per call, median and range."""
import pytest

import course_lib
from course_lib.timing import Timing, time_side_by_side


def test_contenders_are_timed_in_interleaved_rounds_after_an_untimed_warm_up(monkeypatch):
    clock, order = [0.0], []

    def contender(name, seconds):
        def call():
            order.append(name)
            clock[0] += seconds
        return call

    monkeypatch.setattr("course_lib.timing.time.perf_counter", lambda: clock[0])
    timings = time_side_by_side({"slow": contender("slow", 0.3), "fast": contender("fast", 0.1)},
                                rounds=3, calls=2, warmup=1)
    assert order == ["slow", "fast"] + ["slow", "slow", "fast", "fast"] * 3  # warm-up, then turns
    assert list(timings) == ["slow", "fast"]
    assert timings["slow"].seconds == pytest.approx([0.3] * 3) and timings["fast"].median == pytest.approx(0.1)


def test_a_timing_reports_its_median_range_and_spread():
    timing = Timing([0.004, 0.001, 0.002])
    assert (timing.median, timing.low, timing.high) == (0.002, 0.001, 0.004)
    assert timing.spread() == {"median": 0.002, "min": 0.001, "max": 0.004, "over": "3 rounds"}
    assert str(timing) == "2.00 ms (1.00-4.00, 3 rounds)"


def test_a_nonsense_count_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="rounds and calls must be at least 1"):
        course_lib.time_calls(lambda: None, rounds=0)


def test_one_contender_on_the_real_clock_takes_about_its_sleep():
    import time

    timing = course_lib.time_calls(lambda: time.sleep(0.01), rounds=2, warmup=0)
    assert len(timing.seconds) == 2 and 0.009 < timing.low <= timing.high < 1.0
