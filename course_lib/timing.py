"""Time small pieces of work side by side: ``course_lib.time_side_by_side({"fp32": step, "bf16": step_bf16})``.

The lessons' in-notebook measurements (a training step in two precisions, one all_reduce cell on the pool, a
matrix product, reading samples two ways, a batch-size sweep) all follow one recipe, written here once:

* warm-up calls first, untimed (the first calls choose kernels, allocate, open connections);
* ``rounds`` rounds, each timing every contender in turn, so that a change in the machine's load hits them all;
* a round times ``calls`` calls of a contender and keeps the seconds per call; CUDA work is waited for;
* each contender's figure is the median of its rounds, with their range (lowest-highest).

``torch.utils.benchmark.Timer`` adapts the number of calls to a time budget and reports the median and the
interquartile range, for one statement at a time; the lessons compare two to five contenders against each other,
so they need the rounds interleaved, which this does.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable


@dataclass
class Timing:
    """Seconds per call of one contender, one value per round, in the order measured."""

    seconds: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def low(self) -> float:
        return min(self.seconds)

    @property
    def high(self) -> float:
        return max(self.seconds)

    def spread(self) -> dict:
        """The figure as the benchmark records one: median, min, max and what it is over."""
        return {"median": self.median, "min": self.low, "max": self.high, "over": f"{len(self.seconds)} rounds"}

    def __str__(self) -> str:
        return f"{1000 * self.median:.2f} ms ({1000 * self.low:.2f}-{1000 * self.high:.2f}, {len(self.seconds)} rounds)"


def _wait_for_the_gpu() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def time_side_by_side(contenders: dict[str, Callable[[], object]], rounds: int = 5, calls: int = 1,
                      warmup: int = 1) -> dict[str, Timing]:
    """Each contender's seconds per call: ``warmup`` untimed calls of each, then ``rounds`` rounds in which every
    contender in turn makes ``calls`` timed calls. Returns ``{name: Timing}`` in the contenders' order."""
    if rounds < 1 or calls < 1 or warmup < 0:
        raise ValueError(f"rounds and calls must be at least 1 and warmup at least 0 (got {rounds}, {calls}, {warmup})")
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    _wait_for_the_gpu()
    seconds: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            began = time.perf_counter()
            for _ in range(calls):
                fn()
            _wait_for_the_gpu()
            seconds[name].append((time.perf_counter() - began) / calls)
    return {name: Timing(values) for name, values in seconds.items()}


def time_calls(fn: Callable[[], object], rounds: int = 5, calls: int = 1, warmup: int = 1) -> Timing:
    """``time_side_by_side`` for one contender."""
    return time_side_by_side({"fn": fn}, rounds, calls, warmup)["fn"]
