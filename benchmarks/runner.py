"""Run cases: build every implementation, check that they agree, then time them together.

Nothing in a case may crash the suite: a missing peer is a skipped row, an
implementation that raises is a failed row, a treeclass feature that is not ready skips
the whole case (or marks one row "not available"), and an implementation whose numbers
differ from the floor's is a *wrong* row (reported, never timed).

Every row has an *owner*: treeclass (its own row and the hand-written baselines on the
same treeclass model), the floor (plain dicts), or a peer. A peer's failure or wrong
result is the peer's: it is labelled so, and it never counts against treeclass (only
treeclass's or the floor's wrong numbers make the command exit with status 1).

A case with a target whose verdict is *within noise* is measured again: its treeclass
and baseline rows run `plan.remeasure_factor * plan.rounds` more rounds, up to
`plan.remeasures` times, before the verdict stands.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import jax

from .cases import Case, Target, canonical, compare, missing_modules, peer_missing
from .probes import probe
from .stats import WITHIN_NOISE, Verdict, bootstrap_interval, judge, judge_best
from .timing import Plan, Series, measure

__all__ = [
    "CaseResult",
    "EntryResult",
    "owner",
    "paired_baseline",
    "run_case",
    "run_cases",
    "target_verdict",
]


def owner(role: str) -> str:
    """Whose row a role is: `"treeclass"` (its row and its baselines), `"floor"`, `"peer"`."""
    return {"treeclass": "treeclass", "baseline": "treeclass", "floor": "floor"}.get(role, "peer")


@dataclass
class EntryResult:
    """One row: `status` is `ok` (timed), `skipped`, `unavailable` (a treeclass feature
    the row needs is not ready), `failed` (raised) or `wrong` (different numbers)."""

    name: str
    role: str
    status: str
    note: str = ""
    series: Series | None = None

    @property
    def owner(self) -> str:
        return owner(self.role)


@dataclass
class CaseResult:
    """One case: `status` is `ran` or `skipped` (then `note` says why).

    `extra_rounds` counts the rounds added because the verdict was within noise;
    `extra` holds what `Case.extra` returned (e.g. peak memory).
    """

    case: Case
    status: str
    note: str = ""
    entries: list[EntryResult] = field(default_factory=list)
    seconds: float = 0.0
    extra_rounds: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def timed(self, name: str) -> Series | None:
        for entry in self.entries:
            if entry.name == name and entry.status == "ok":
                return entry.series
        return None

    def by_role(self, role: str) -> EntryResult | None:
        for entry in self.entries:
            if entry.role == role:
                return entry
        return None


def _target_series(result: CaseResult) -> tuple[Target, Series, list[tuple[str, Series]]] | None:
    """The target, the treeclass row's series and the timed baselines' `(name, series)`,
    or `None` when the case has no target, or treeclass or every baseline went untimed."""
    target = result.case.target
    if target is None:
        return None
    tc = result.timed("treeclass")
    bases = [(name, s) for name in target.baselines if (s := result.timed(name)) is not None]
    if tc is None or not bases:
        return None
    return target, tc, bases


def target_verdict(result: CaseResult) -> Verdict | None:
    """The case's target against the timed rows, or `None` when treeclass or every
    baseline went untimed (or the case has no target)."""
    found = _target_series(result)
    if found is None:
        return None
    target, tc, bases = found
    if target.statistic == "best":
        which = target.paired_with(tc.times, [s.times for _, s in bases])
        return judge_best(target.direction, target.limit, tc.times, bases[which][1].times)
    if target.statistic != "paired":
        raise ValueError(f"unknown target statistic {target.statistic!r}: 'paired' or 'best'")
    values = target.per_round(tc.times, [s.times for _, s in bases])
    return judge(target.direction, target.limit, values)


def beside_ratios(result: CaseResult) -> list[dict[str, Any]]:
    """The case's `beside` ratios against this run: per ratio `label`, `numerator`,
    `denominator`, and `measured` (the median of the paired per-round ratios over the
    rounds both rows ran), `low`, `high` (its bootstrap interval) and `rounds`, all
    `None` when either row went untimed."""
    out = []
    for label, numerator, denominator in result.case.beside:
        item: dict[str, Any] = {
            "label": label,
            "numerator": numerator,
            "denominator": denominator,
            "measured": None,
            "low": None,
            "high": None,
            "rounds": None,
        }
        a, b = result.timed(numerator), result.timed(denominator)
        if result.status == "ran" and a is not None and b is not None and a.times and b.times:
            values = [x / y for x, y in zip(a.times, b.times)]
            low, high = bootstrap_interval(values)
            item.update(measured=statistics.median(values), low=low, high=high, rounds=len(values))
        out.append(item)
    return out


def paired_baseline(result: CaseResult) -> str | None:
    """The name of the baseline row the target's paired values divide by (for a "the
    fastest of" target, the one `Target.paired_with` picks), or `None` when not timed."""
    found = _target_series(result)
    if found is None:
        return None
    target, tc, bases = found
    return bases[target.paired_with(tc.times, [s.times for _, s in bases])][0]


def _one_line(error: BaseException, limit: int = 160) -> str:
    text = str(error).strip()
    first = text.splitlines()[0] if text else ""
    line = f"{type(error).__name__}: {first}" if first else type(error).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _first_result(op: Callable[[], Any], sync: Callable[[Any], Any] | None) -> Any:
    result = op()
    if sync is not None:
        sync(result)
    return result


def run_case(case: Case, plan: Plan, rng: random.Random) -> CaseResult:
    """Check and time one case.

    **Arguments**

    - `case`: the case;
    - `plan`: how much to time;
    - `rng`: the source of the shuffled orders.

    **Returns**

    A `CaseResult` whose timed rows hold a `Series` each.

    ```python
    import random
    from benchmarks.cases import SMOKE_SIZES
    from benchmarks.runner import run_case
    from benchmarks.suite import all_cases
    from benchmarks.timing import Plan

    case = next(c for c in all_cases(SMOKE_SIZES) if c.name == "flatten_4_fields")
    result = run_case(case, Plan(1, 0.0, 0, calibrate=False), random.Random(0))
    assert result.status == "ran"
    ```
    """
    start = time.perf_counter()
    if case.plan is not None:
        plan = case.plan(plan)
    if case.backends and jax.default_backend() not in case.backends:
        return CaseResult(
            case,
            "skipped",
            f"runs on {' or '.join(case.backends)} only (sized for an accelerator); this "
            f"run's backend is {jax.default_backend()}",
        )
    missing = missing_modules(case)
    if missing:
        return CaseResult(case, "skipped", f"needs {', '.join(missing)} (not installed)")
    for feature in case.needs:
        reason = probe(feature)
        if reason is not None:
            return CaseResult(case, "skipped", reason)
    try:
        entries = case.entries()
    except Exception as error:  # a broken case must not take the others down
        return CaseResult(case, "skipped", f"could not set up: {_one_line(error)}")

    results: list[EntryResult] = []
    ops: dict[str, Callable[[], Any]] = {}
    canons: dict[str, dict] = {}
    for entry in entries:
        row = EntryResult(entry.name, entry.role, "ok", entry.note)
        results.append(row)
        reasons = [r for r in (probe(feature) for feature in entry.needs) if r is not None]
        if reasons:
            row.status, row.note = "unavailable", reasons[0]
            continue
        try:
            op = entry.build()
        except Exception as error:
            if peer_missing(error):
                row.status, row.note = "skipped", _one_line(error).split(": ", 1)[-1]
            else:
                row.status, row.note = "failed", f"setup raised {_one_line(error)}"
            continue
        try:
            canons[entry.name] = (entry.canon or canonical)(_first_result(op, case.sync))
        except Exception as error:
            row.status, row.note = "failed", f"first call raised {_one_line(error)}"
            continue
        ops[entry.name] = op

    reference = _reference(results, canons)
    if reference is not None:
        for row in results:
            if row.status != "ok" or row.name == reference:
                continue
            difference = compare(canons[row.name], canons[reference], case.rtol)
            if difference is not None:
                row.status, row.note = "wrong", f"differs from {reference}: {difference}"
                del ops[row.name]

    result = CaseResult(case, "ran", "", results)
    if ops:
        series = measure(ops, case.sync, plan, rng)
        for row in results:
            if row.name in series:
                row.series = series[row.name]
        _remeasure_if_within_noise(result, ops, plan, rng)
    if case.extra is not None:
        try:
            result.extra = case.extra()
        except Exception as error:  # the extra figures are optional; the timings stand
            result.extra = {"error": _one_line(error)}
    result.seconds = time.perf_counter() - start
    return result


def _remeasure_if_within_noise(
    result: CaseResult, ops: dict[str, Callable[[], Any]], plan: Plan, rng: random.Random
) -> None:
    target = result.case.target
    if target is None or plan.rounds < 2:
        return
    # the floor row is measured again with the target's rows: every "vs floor" ratio and
    # every median in the table then rests on the same rounds (a floor timed in the first
    # rounds only would be paired with a part of the treeclass row its median leaves out)
    floor = result.by_role("floor")
    extra_rows = (floor.name,) if floor is not None else ()
    extra_rows += tuple(name for _, *pair in result.case.beside for name in pair)
    names = list(
        dict.fromkeys(
            name for name in ("treeclass", *target.baselines, *extra_rows) if result.timed(name)
        )
    )
    for _ in range(plan.remeasures):
        verdict = target_verdict(result)
        if verdict is None or verdict.status != WITHIN_NOISE:
            return
        rows = {name: result.timed(name) for name in names}
        extra = plan.rounds * plan.remeasure_factor
        more = measure(
            {name: ops[name] for name in names},
            result.case.sync,
            dataclasses.replace(plan, rounds=extra),
            rng,
            numbers={name: rows[name].number for name in names},
        )
        for name, series in more.items():
            rows[name].times.extend(series.times)
        result.extra_rounds += extra


def _reference(results: list[EntryResult], canons: dict[str, dict]) -> str | None:
    ok = [row for row in results if row.status == "ok" and row.name in canons]
    for role in ("floor", "treeclass"):
        for row in ok:
            if row.role == role:
                return row.name
    return ok[0].name if ok else None


def run_cases(
    cases: list[Case], plan: Plan, seed: int = 0, progress: TextIO | None = None
) -> list[CaseResult]:
    """Run `cases` in order, writing one progress line per case to `progress` (if given)."""
    rng = random.Random(seed)
    results = []
    width = len(str(len(cases)))
    for index, case in enumerate(cases, 1):
        if progress is not None:
            progress.write(f"[{index:>{width}}/{len(cases)}] {case.name} ... ")
            progress.flush()
        result = run_case(case, plan, rng)
        results.append(result)
        if progress is not None:
            progress.write(progress_summary(result) + "\n")
            progress.flush()
    return results


_PROGRESS_LABELS = {
    "skipped": "skipped",
    "unavailable": "not available",
    "failed": "FAILED",
    "wrong": "WRONG NUMBERS",
}


def progress_summary(result: CaseResult) -> str:
    """One line per case: rows timed, whose rows did not run and why, the verdict."""
    if result.status == "skipped":
        return f"skipped: {result.note}"
    timed = sum(row.status == "ok" for row in result.entries)
    parts = [f"{timed} timed"]
    peer_trouble = [
        row.name
        for row in result.entries
        if row.owner == "peer" and row.status in ("failed", "wrong")
    ]
    if peer_trouble:
        parts.append(f"peer failed, not counted against treeclass: {', '.join(peer_trouble)}")
    for row in result.entries:
        if row.owner != "peer" and row.status not in ("ok", "skipped"):
            parts.append(f"{row.name} {_PROGRESS_LABELS[row.status]}")
    verdict = target_verdict(result)
    if verdict is not None:
        more = f", {result.extra_rounds} more rounds" if result.extra_rounds else ""
        parts.append(
            f"target {verdict.status} ({verdict.measured:.3g} in "
            f"[{verdict.low:.3g}, {verdict.high:.3g}]{more})"
        )
    return f"{'; '.join(parts)} ({result.seconds:.1f} s)"
