"""Timing that stays stable on a noisy machine.

Every implementation of a case is timed in each *round*, in a freshly shuffled order, so
that a burst of noise (another process, frequency scaling, a garbage collection) hits
all of them alike. A *sample* is a batch of calls timed together, sized by calibration to
last about `Plan.sample_s`; its time divided by the number of calls is one per-call time.
Reported figures are the median over rounds of the per-call time, and the median over
rounds of the per-round *ratio* between two implementations: a ratio taken inside one
round cancels whatever that round's noise did to both.

As in `timeit`, the garbage collector is paused while a sample runs.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CLOCKS",
    "Plan",
    "Prepared",
    "Series",
    "measure",
    "median_ratio",
    "one_call_per_sample",
]

# A sample's calibration stops once a batch lasts this fraction of the sample duration.
_CALIBRATION_FRACTION = 0.2


@dataclass(frozen=True)
class Plan:
    """How much to measure.

    - `rounds`: rounds of interleaved samples (the medians are over these);
    - `sample_s`: the target duration of one sample;
    - `warmup`: untimed calls per implementation before calibration;
    - `calibrate`: when False, every sample is one call (the smoke mode of the tests);
    - `max_number`: the most calls in one sample;
    - `clock`: `"wall"` (`time.perf_counter`, the default) or `"cpu"` (this process's CPU
      time, `time.process_time`: blind to the time the process waits for a CPU on a busy
      machine, so steadier there, but it also misses time spent waiting for a device, so
      it is only meaningful on the CPU backend with synchronous dispatch);
    - `remeasures`: how many times a case whose target verdict is *within noise* is
      measured again, each time `remeasure_factor * rounds` more rounds, before the
      verdict stands.
    """

    rounds: int
    sample_s: float
    warmup: int
    calibrate: bool = True
    max_number: int = 100_000
    clock: str = "wall"
    remeasures: int = 0
    remeasure_factor: int = 2


def one_call_per_sample(plan: Plan) -> Plan:
    """`plan` for an operation of a second or more (a gigabyte saved, a model compiled).

    One call per sample (the first, checked call warms it up), on the wall clock (such
    work runs threads), at most five rounds (with three, the bootstrap interval of a
    median is just the spread of the three) and at most one re-measure of five more.
    """
    return Plan(
        rounds=min(plan.rounds, 5),
        sample_s=0.0,
        warmup=0,
        calibrate=False,
        clock="wall",
        remeasures=min(plan.remeasures, 1),
        remeasure_factor=1,
    )


@dataclass
class Series:
    """The per-call times of one implementation: one entry per round, in round order."""

    number: int
    times: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.times)


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


@dataclass(frozen=True)
class Prepared:
    """A timed operation with work to do, untimed, before each sample.

    `measure` calls `prepare()` before it starts the clock for a sample of `fn` (once per
    sample: the checkpoint cases, whose samples are one call each, remove the previous
    file there). Calling the object calls `fn`, so warm-up and checks are unchanged.
    """

    fn: Callable[[], Any]
    prepare: Callable[[], None]

    def __call__(self) -> Any:
        return self.fn()


# the smallest time a clock tells apart from none (time.get_clock_info), and a floor
_TICKS = {
    name: max(time.get_clock_info(function.__name__).resolution, 1e-9)
    for name, function in CLOCKS.items()
}


def _at_least_a_tick(elapsed: float, clock_name: str) -> float:
    """A batch the clock saw take no time took at most one tick: count one, so no ratio
    divides by zero (a coarse process clock, as on some virtual machines, reads 0 for a
    single fast call)."""
    return max(elapsed, _TICKS[clock_name])


def _time_batch(
    fn: Callable[[], Any], sync: Callable[[Any], Any] | None, number: int, clock_name: str
) -> float:
    clock = CLOCKS[clock_name]
    if isinstance(fn, Prepared):
        fn.prepare()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        if sync is None:
            start = clock()
            for _ in range(number):
                fn()
            return _at_least_a_tick(clock() - start, clock_name)
        start = clock()
        for _ in range(number):
            sync(fn())
        return _at_least_a_tick(clock() - start, clock_name)
    finally:
        if gc_was_enabled:
            gc.enable()


def _calibrate(fn: Callable[[], Any], sync: Callable[[Any], Any] | None, plan: Plan) -> int:
    number = 1
    while True:
        elapsed = _time_batch(fn, sync, number, plan.clock)
        if elapsed >= plan.sample_s * _CALIBRATION_FRACTION or number >= plan.max_number:
            break
        number = min(number * 4, plan.max_number)
    per_call = max(elapsed / number, 1e-9)
    return max(1, min(plan.max_number, round(plan.sample_s / per_call)))


def measure(
    fns: dict[str, Callable[[], Any]],
    sync: Callable[[Any], Any] | None,
    plan: Plan,
    rng: random.Random,
    numbers: dict[str, int] | None = None,
) -> dict[str, Series]:
    """Time every function in `fns` in interleaved, shuffled rounds.

    **Arguments**

    - `fns`: implementation name -> a zero-argument function doing one operation;
    - `sync`: called on each result before the clock reads it (`block_until_ready`
      for work dispatched to a device), or `None` for pure-Python work;
    - `plan`: rounds, sample duration and warm-up;
    - `rng`: the source of the shuffled orders;
    - `numbers`: calls per sample by name, from an earlier `Series.number`: no warm-up
      and no calibration then (measuring more rounds of the same functions).

    **Returns**

    Name -> `Series` of per-call times in seconds, one per round.

    ```python
    import random
    from benchmarks.timing import Plan, measure

    series = measure({"a": lambda: 1 + 1}, None, Plan(3, 1e-3, 1), random.Random(0))
    assert len(series["a"].times) == 3
    ```
    """
    if numbers is None:
        for fn in fns.values():
            for _ in range(plan.warmup):
                if sync is None:
                    fn()
                else:
                    sync(fn())
        numbers = {
            name: (_calibrate(fn, sync, plan) if plan.calibrate else 1) for name, fn in fns.items()
        }
    series = {name: Series(numbers[name], []) for name in fns}
    names = list(fns)
    for index in range(plan.rounds):
        # collection is off while a batch is timed: each round starts with an empty heap
        # (a smoke run's single-call samples skip it: 0.2-0.6 s a collection in a test run)
        if index or plan.calibrate:
            gc.collect()
        order = names[:]
        rng.shuffle(order)
        for name in order:
            elapsed = _time_batch(fns[name], sync, numbers[name], plan.clock)
            series[name].times.append(elapsed / numbers[name])
    return series


def median_ratio(a: Series, b: Series) -> float:
    """The median over rounds of `a`'s time divided by `b`'s time in the same round.

    Only the rounds both series ran are paired: round `i` of one with round `i` of the
    other (a re-measure appends rounds to some rows only; their extra rounds have no
    partner and are left out)."""
    shared = min(len(a.times), len(b.times))
    if shared == 0:
        raise ValueError("median_ratio needs a round both series ran")
    return statistics.median(a.times[i] / b.times[i] for i in range(shared))
