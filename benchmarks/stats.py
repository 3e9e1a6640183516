"""The statistics behind a verdict: bootstrap intervals, target verdicts, scaling exponents.

Pure functions on lists of numbers, so the tests check them on synthetic timings.

- A *paired ratio* is one round's treeclass time divided by the baseline's time in the
  same round (see `timing`); the figure a report shows is their median.
- Its *interval* is a percentile bootstrap of that median: resample the rounds with
  replacement, take each resample's median, keep the central 95%. It says how far the
  median could move on a rerun of as many rounds on an equally noisy machine.
- A target is *met* when the whole interval is on the right side of the limit, *missed*
  when the whole interval is on the wrong side, and *within noise* when the interval
  straddles it: then the runner measures more rounds before it settles for that.
- A *scaling exponent* `k` is the slope of a least-squares line through
  `(log n, log time)`: cost grows like `n ** k`.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "CONFIDENCE",
    "MET",
    "MISSED",
    "WITHIN_NOISE",
    "Verdict",
    "bootstrap_interval",
    "fit_exponent",
    "judge",
    "judge_best",
]

CONFIDENCE = 0.95
MET, MISSED, WITHIN_NOISE = "met", "missed", "within noise"
_RESAMPLES = 2000


def bootstrap_interval(
    values: Sequence[float],
    confidence: float = CONFIDENCE,
    resamples: int = _RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """The percentile-bootstrap interval of the median of `values`.

    **Arguments**

    - `values`: one number per round (at least one);
    - `confidence`: the central fraction of the resampled medians kept;
    - `resamples`: how many resamples; `seed`: their source (fixed, so a report is
      reproducible from its per-round numbers).

    **Returns**

    `(low, high)`; a single value gives `(value, value)`.

    ```python
    from benchmarks.stats import bootstrap_interval

    low, high = bootstrap_interval([1.0, 1.1, 0.9, 1.05, 0.95])
    assert 0.9 <= low <= 1.0 <= high <= 1.1
    ```
    """
    if not values:
        raise ValueError("bootstrap_interval needs at least one value")
    if len(values) == 1:
        return values[0], values[0]
    rng = random.Random(seed)
    count = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=count)) for _ in range(resamples))
    tail = (1.0 - confidence) / 2.0
    low = medians[int(math.floor(tail * (resamples - 1)))]
    high = medians[int(math.ceil((1.0 - tail) * (resamples - 1)))]
    return low, high


@dataclass(frozen=True)
class Verdict:
    """A target against one run.

    - `status`: `MET`, `MISSED` or `WITHIN_NOISE`;
    - `measured`: the median of the per-round values;
    - `low`, `high`: its bootstrap interval;
    - `margin`: how far the median is from the limit, as a fraction of the limit,
      positive on the good side ("met by 9%" is a margin of 0.09), negative on the bad
      side ("missed by 2%");
    - `rounds`: how many per-round values it rests on.
    """

    status: str
    measured: float
    low: float
    high: float
    margin: float
    rounds: int


def judge(kind: str, limit: float, values: Sequence[float], seed: int = 0) -> Verdict:
    """The verdict of per-round `values` against a target.

    **Arguments**

    - `kind`: `"at_most"` (a ratio that must stay at or below `limit`: treeclass's time
      over a baseline's) or `"at_least"` (a speed-up that must reach `limit`);
    - `limit`: the target's bound;
    - `values`: one paired value per round.

    **Returns**

    A `Verdict`: met when the whole interval is on the good side of `limit` (touching
    it counts as met), missed when it is wholly on the bad side, else within noise.

    ```python
    from benchmarks.stats import judge

    assert judge("at_most", 1.10, [1.00, 1.01, 0.99, 1.02, 1.00]).status == "met"
    assert judge("at_most", 1.10, [1.05, 1.15, 1.08, 1.13, 1.11]).status == "within noise"
    ```
    """
    if kind not in ("at_most", "at_least"):
        raise ValueError(f"unknown target kind {kind!r}: 'at_most' or 'at_least'")
    measured = statistics.median(values)
    low, high = bootstrap_interval(values, seed=seed)
    if kind == "at_most":
        margin = (limit - measured) / limit
        status = MET if high <= limit else MISSED if low > limit else WITHIN_NOISE
    else:
        margin = (measured - limit) / limit
        status = MET if low >= limit else MISSED if high < limit else WITHIN_NOISE
    return Verdict(status, measured, low, high, margin, len(values))


def judge_best(
    kind: str,
    limit: float,
    treeclass: Sequence[float],
    baseline: Sequence[float],
    seed: int = 0,
    resamples: int = _RESAMPLES,
) -> Verdict:
    """The verdict of a ratio of *best* times: each implementation's fastest sample.

    For deterministic work whose samples fall in groups (a compile of an unrolled model:
    a fast group, and a slow one when the host interferes), the median of paired ratios
    depends on how many rounds each group happened to get, and flips between runs. The
    fastest sample is the work undisturbed; the ratio of the two fastest is stable as long
    as each implementation lands in its fast group a few times.

    **Arguments**

    - `kind`, `limit`: as for `judge` (`"at_most"`: treeclass's best over the baseline's;
      `"at_least"`: the baseline's best over treeclass's);
    - `treeclass`, `baseline`: the per-round times (each at least one).

    **Returns**

    A `Verdict` on the ratio of the minima; its interval is a bootstrap that resamples
    each series (with replacement) and takes the ratio of the resamples' minima: it is
    wide when a series' fast group is one sample, narrow when the group is several.

    ```python
    from benchmarks.stats import judge_best

    unrolled = [2.7, 8.1, 2.6, 8.3, 2.7, 8.0, 2.65, 7.9]  # two groups
    stacked = [0.2, 0.21, 0.2, 0.22, 0.2, 0.2, 0.21, 0.2]
    assert judge_best("at_least", 10.0, stacked, unrolled).status == "met"
    ```
    """
    if kind not in ("at_most", "at_least"):
        raise ValueError(f"unknown target kind {kind!r}: 'at_most' or 'at_least'")
    if not treeclass or not baseline:
        raise ValueError("judge_best needs at least one time of each implementation")

    def ratio(ours: Sequence[float], theirs: Sequence[float]) -> float:
        return min(ours) / min(theirs) if kind == "at_most" else min(theirs) / min(ours)

    measured = ratio(treeclass, baseline)
    rng = random.Random(seed)
    ratios = sorted(
        ratio(rng.choices(treeclass, k=len(treeclass)), rng.choices(baseline, k=len(baseline)))
        for _ in range(resamples)
    )
    tail = (1.0 - CONFIDENCE) / 2.0
    low = ratios[int(math.floor(tail * (resamples - 1)))]
    high = ratios[int(math.ceil((1.0 - tail) * (resamples - 1)))]
    if kind == "at_most":
        margin = (limit - measured) / limit
        status = MET if high <= limit else MISSED if low > limit else WITHIN_NOISE
    else:
        margin = (measured - limit) / limit
        status = MET if low >= limit else MISSED if high < limit else WITHIN_NOISE
    return Verdict(status, measured, low, high, margin, min(len(treeclass), len(baseline)))


def fit_exponent(sizes: Sequence[float], times: Sequence[float]) -> float:
    """The slope `k` of the least-squares line through `(log size, log time)`.

    **Arguments**

    - `sizes`, `times`: at least two pairs, sizes not all equal, times positive.

    **Returns**

    `k`, so that `time ~ size ** k`: 1 for linear growth, 2 for quadratic.

    ```python
    from benchmarks.stats import fit_exponent

    assert round(fit_exponent([10, 100, 1000], [1e-6, 1e-5, 1e-4]), 6) == 1.0
    ```
    """
    if len(sizes) != len(times) or len(sizes) < 2:
        raise ValueError("fit_exponent needs two or more (size, time) pairs")
    xs = [math.log(s) for s in sizes]
    ys = [math.log(t) for t in times]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        raise ValueError("fit_exponent needs at least two different sizes")
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread
