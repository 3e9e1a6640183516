"""Run cases: build every implementation, check that they agree, then time them together.

Nothing in a case may crash the suite: a missing peer is a skipped row, a peer that
raises is a failed row, a treeclass feature that is not ready skips the whole case, and
an implementation whose numbers differ from the floor's is a *wrong* row (reported,
never timed, and the command exits with status 1).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from .cases import Case, canonical, compare, missing_modules, peer_missing
from .probes import probe
from .timing import Plan, Series, measure

__all__ = ["CaseResult", "EntryResult", "run_case", "run_cases"]


@dataclass
class EntryResult:
    """One row: `status` is `ok` (timed), `skipped`, `failed` or `wrong`."""

    name: str
    role: str
    status: str
    note: str = ""
    series: Series | None = None


@dataclass
class CaseResult:
    """One case: `status` is `ran` or `skipped` (then `note` says why)."""

    case: Case
    status: str
    note: str = ""
    entries: list[EntryResult] = field(default_factory=list)
    seconds: float = 0.0

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
    from benchmarks.cases import SMOKE_SIZES, all_cases
    from benchmarks.runner import run_case
    from benchmarks.timing import Plan

    case = next(c for c in all_cases(SMOKE_SIZES) if c.name == "flatten_4_fields")
    result = run_case(case, Plan(1, 0.0, 0, calibrate=False), random.Random(0))
    assert result.status == "ran"
    ```
    """
    start = time.perf_counter()
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
            difference = compare(canons[row.name], canons[reference])
            if difference is not None:
                row.status, row.note = "wrong", f"differs from {reference}: {difference}"
                del ops[row.name]

    if ops:
        series = measure(ops, case.sync, plan, rng)
        for row in results:
            if row.name in series:
                row.series = series[row.name]
    return CaseResult(case, "ran", "", results, time.perf_counter() - start)


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
            progress.write(_progress_summary(result) + "\n")
            progress.flush()
    return results


def _progress_summary(result: CaseResult) -> str:
    if result.status == "skipped":
        return f"skipped: {result.note}"
    counts: dict[str, int] = {}
    for row in result.entries:
        counts[row.status] = counts.get(row.status, 0) + 1
    parts = [f"{counts.pop('ok', 0)} timed"] + [f"{n} {status}" for status, n in counts.items()]
    return f"{', '.join(parts)} ({result.seconds:.1f} s)"
