"""What a run prints and saves: the header, a Markdown table per case, JSON, a PNG plot.

Ratios are medians of per-round ratios (see `timing`), so a row's "vs floor" is not its
median time divided by the floor's median time, though the two are usually close.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
from typing import Any

from .runner import CaseResult, EntryResult
from .timing import Plan, median_best_ratio, median_ratio

__all__ = [
    "collect_header",
    "evaluate_target",
    "format_markdown",
    "plot_ratios",
    "to_json",
]

_VERSIONED = ("jax", "jaxlib", "numpy", "treeclass", "optax", "equinox", "flax", "pytreeclass",
              "sepes", "matplotlib")
_PLOT_NEEDS_MATPLOTLIB = "--plot needs matplotlib (pip install matplotlib); no plot written"


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def collect_header(dispatch: str, plan: Plan, mode: str, command: str) -> dict[str, Any]:
    """The facts a reader needs to compare two runs: machine, backend, versions, method.

    **Arguments**

    - `dispatch`: a sentence saying which dispatch mode ran;
    - `plan`: the timing plan;
    - `mode`: `"full"`, `"quick"` or `"smoke"`;
    - `command`: the command line, as the user would type it.

    **Returns**

    A JSON-ready dict.
    """
    import jax

    devices = jax.devices()
    try:
        load = "{:.1f}, {:.1f}, {:.1f}".format(*os.getloadavg())
    except (AttributeError, OSError):  # not on every platform
        load = "unknown"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "mode": mode,
        "machine": f"{platform.system()} {platform.machine()}, {_cpu_model()}, "
                   f"{os.cpu_count()} CPUs",
        "load_average": load,
        "python": platform.python_version(),
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        "dispatch": dispatch,
        "versions": {name: _version(name) for name in _VERSIONED},
        "timing": {
            "rounds": plan.rounds,
            "sample_s": plan.sample_s,
            "warmup_calls": plan.warmup,
            "calibrated": plan.calibrate,
            "clock": plan.clock,
        },
    }


# -- numbers --------------------------------------------------------------------------------


def _ratio(row: EntryResult, to: EntryResult | None) -> float | None:
    if row.series is None or to is None or to.series is None:
        return None
    return median_ratio(row.series, to.series)


def _timed(result: CaseResult, role: str) -> EntryResult | None:
    row = result.by_role(role)
    return row if row is not None and row.status == "ok" else None


def evaluate_target(result: CaseResult) -> dict[str, Any] | None:
    """The case's DESIGN.md target against this run: measured value, met or not, a sentence."""
    target = result.case.target
    if target is None:
        return None
    out: dict[str, Any] = {"text": target.text, "kind": target.kind, "limit": target.limit,
                           "baselines": list(target.baselines), "measured": None, "met": None,
                           "gap": None}
    tc = result.timed("treeclass")
    bases = [s for s in (result.timed(name) for name in target.baselines) if s is not None]
    if tc is None or not bases:
        missing = "treeclass" if tc is None else ", ".join(target.baselines)
        out["summary"] = f"not measured ({missing} not timed)"
        return out
    if target.kind == "max_ratio":
        measured = median_ratio(tc, bases[0])
        met = measured <= target.limit
        gap = abs(measured - target.limit) / target.limit
        verdict = f"met by {gap:.0%}" if met else f"missed by {gap:.0%}"
        out["summary"] = f"{verdict} ({measured:.2f}x; target {target.text})"
    else:
        measured = median_best_ratio(bases, tc)
        met = measured >= target.limit
        gap = abs(measured - target.limit) / target.limit
        verdict = f"met by {gap:.0%}" if met else f"missed by {gap:.0%}"
        out["summary"] = (f"{verdict} ({measured:.1f}x faster than the fastest of them; "
                          f"target {target.text})")
    out["measured"], out["met"], out["gap"] = measured, met, gap
    return out


def _published(result: CaseResult) -> list[dict[str, Any]]:
    rows = []
    for numerator, denominator, value in result.case.published:
        a, b = result.timed(numerator), result.timed(denominator)
        ours = median_ratio(a, b) if a is not None and b is not None else None
        rows.append({"ratio": f"{numerator} / {denominator}", "published": value, "ours": ours})
    for numerator in ("flax.struct", "equinox (filter_jit)"):
        a, b = result.timed(numerator), result.timed("treeclass")
        if result.case.published and a is not None and b is not None:
            rows.append({"ratio": f"{numerator} / treeclass", "published": None,
                         "ours": median_ratio(a, b)})
    return rows


# -- Markdown -------------------------------------------------------------------------------


def _seconds(value: float | None) -> str:
    if value is None:
        return "—"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"


def _times(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.0f}x" if value >= 100 else f"{value:.2f}x"


def _row_note(row: EntryResult) -> str:
    if row.status == "ok":
        return row.note
    label = {"skipped": "skipped", "failed": "FAILED", "wrong": "WRONG NUMBERS"}[row.status]
    return f"{label}: {row.note}" if row.note else label


def _case_markdown(result: CaseResult) -> list[str]:
    case = result.case
    lines = [f"### `{case.name}`: {case.title}", ""]
    if result.status == "skipped":
        return [*lines, f"Skipped: {result.note}", ""]
    tc, floor = _timed(result, "treeclass"), _timed(result, "floor")
    target = evaluate_target(result)
    lines += ["| implementation | median | vs treeclass | vs floor | target | note |",
              "|---|---:|---:|---:|---|---|"]
    for row in result.entries:
        name = f"**{row.name}**" if row.role == "treeclass" else row.name
        if row.role == "floor":
            name += " (floor)"
        target_cell = ""
        if target is not None:
            if row.role == "treeclass":
                target_cell = target["summary"]
            elif row.name in target["baselines"]:
                target_cell = "target baseline"
        median = row.series.median if row.series is not None else None
        cells = [name, _seconds(median), _times(_ratio(row, tc)), _times(_ratio(row, floor)),
                 target_cell, _row_note(row).replace("|", "\\|")]
        lines.append("| " + " | ".join(cells) + " |")
    published = _published(result)
    if published:
        lines += ["", "| ratio | published | this run |", "|---|---:|---:|"]
        for item in published:
            shown = f"{item['published']:.3f}" if item["published"] is not None else "—"
            ours = f"{item['ours']:.3f}" if item["ours"] is not None else "—"
            lines.append(f"| {item['ratio']} | {shown} | {ours} |")
        lines += ["", case.published_note]
    return [*lines, ""]


def format_markdown(header: dict[str, Any], results: list[CaseResult]) -> str:
    """The whole report as Markdown: header, one table per case, then the targets."""
    versions = ", ".join(f"{k} {v}" for k, v in header["versions"].items())
    timing = header["timing"]
    method = (
        f"median of {timing['rounds']} rounds; in each round every implementation runs one "
        f"sample (~{timing['sample_s'] * 1e3:g} ms of back-to-back calls) in a fresh shuffled "
        "order; ratios are medians of per-round ratios; "
        f"{timing['warmup_calls']} warm-up call{'' if timing['warmup_calls'] == 1 else 's'} "
        "first; gc paused during samples; clock: "
        + ("wall time" if timing["clock"] == "wall" else
           "this process's CPU time, which equals wall time for synchronous CPU work but "
           "ignores time spent waiting for a CPU on a busy machine (`--clock wall` for wall "
           "time)")
        if timing["calibrated"] else
        f"smoke mode: {timing['rounds']} round of single calls (numbers are not meaningful)"
    )
    lines = [
        "# treeclass benchmarks",
        "",
        f"- date: {header['date']}",
        f"- command: `{header['command']}`",
        f"- machine: {header['machine']}; Python {header['python']}; load average at the "
        f"end (1, 5, 15 min): {header['load_average']}",
        f"- backend: {header['backend']} (device kind: {header['device_kind']}, "
        f"{header['device_count']} device(s))",
        f"- dispatch: {header['dispatch']}",
        f"- versions: {versions}",
        f"- method: {method}",
        "- columns: *vs treeclass* and *vs floor* divide each row's time by the treeclass "
        "row's and by the plain dict/list row's (lower is faster); *target* is the "
        "DESIGN.md section 5 target for the treeclass row",
        "",
    ]
    group = None
    for result in results:
        if result.case.group != group:
            group = result.case.group
            lines += [f"## {group}", ""]
        lines += _case_markdown(result)
    lines += _targets_markdown(results)
    return "\n".join(lines).rstrip() + "\n"


def _targets_markdown(results: list[CaseResult]) -> list[str]:
    rows = []
    for result in results:
        if result.case.target is None:
            continue
        if result.status == "skipped":
            rows.append(f"| `{result.case.name}` | {result.case.target.text} | — | skipped |")
            continue
        target = evaluate_target(result)
        measured = target["measured"]
        shown = "—" if measured is None else (
            f"{measured:.2f}x" if target["kind"] == "max_ratio" else f"{measured:.1f}x faster")
        if target["met"] is None:
            status = target["summary"]
        else:
            status = f"{'met' if target['met'] else '**missed**'} by {target['gap']:.0%}"
        rows.append(f"| `{result.case.name}` | {target['text']} | {shown} | {status} |")
    if not rows:
        return []
    return ["## Targets (DESIGN.md section 5)", "",
            "| case | target | treeclass | result |", "|---|---|---:|---|", *rows, ""]


# -- JSON and plot ------------------------------------------------------------------------------


def to_json(header: dict[str, Any], results: list[CaseResult]) -> dict[str, Any]:
    """Everything measured, for machines to compare runs (times in seconds)."""
    cases = []
    for result in results:
        tc, floor = _timed(result, "treeclass"), _timed(result, "floor")
        rows = []
        for row in result.entries:
            rows.append({
                "name": row.name,
                "role": row.role,
                "status": row.status,
                "note": row.note,
                "number": row.series.number if row.series is not None else None,
                "median_s": row.series.median if row.series is not None else None,
                "times_s": list(row.series.times) if row.series is not None else [],
                "vs_treeclass": _ratio(row, tc),
                "vs_floor": _ratio(row, floor),
            })
        cases.append({
            "name": result.case.name,
            "group": result.case.group,
            "title": result.case.title,
            "status": result.status,
            "note": result.note,
            "seconds": result.seconds,
            "target": evaluate_target(result) if result.status == "ran" else (
                None if result.case.target is None else
                {"text": result.case.target.text, "measured": None, "met": None,
                 "summary": "skipped"}),
            "published": _published(result) if result.status == "ran" else [],
            "rows": rows,
        })
    return {"header": header, "cases": cases}


def plot_ratios(results: list[CaseResult], path: str) -> str | None:
    """Write a PNG bar chart of every timed row's ratio to the floor (or to treeclass).

    **Returns**

    `None` on success, or a one-line reason no plot was written (matplotlib missing).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return _PLOT_NEEDS_MATPLOTLIB
    panels = []
    for result in results:
        base = _timed(result, "floor") or _timed(result, "treeclass")
        rows = [row for row in result.entries if row.series is not None]
        if result.status == "ran" and base is not None and rows:
            label = "floor" if base.role == "floor" else "treeclass"
            panels.append((result, label, [(row, _ratio(row, base)) for row in rows]))
    if not panels:
        return "nothing was timed; no plot written"
    columns = 3
    count = len(panels)
    rows_of_panels = (count + columns - 1) // columns
    figure, axes = plt.subplots(rows_of_panels, columns, squeeze=False,
                                figsize=(6 * columns, 2.6 * rows_of_panels))
    for axis in axes.flat[count:]:
        axis.set_visible(False)
    for axis, (result, label, bars) in zip(axes.flat, panels):
        _draw_panel(axis, result.case.name, label, bars)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return None


def _draw_panel(axis: Any, title: str, label: str, bars: list[tuple[EntryResult, float]]) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    names = [row.name.replace(" (", "\n(") for row, _ in bars][::-1]
    values = [value for _, value in bars][::-1]
    colors = ["tab:orange" if row.role == "treeclass" else
              "tab:gray" if row.role in ("floor", "baseline") else "tab:blue"
              for row, _ in bars][::-1]
    # bars grow from 1x (the divisor) to the ratio, so faster rows point left
    axis.barh(names, [v - 1.0 for v in values], left=1.0, color=colors)
    axis.axvline(1.0, color="black", linewidth=0.8)
    axis.set_xscale("log")
    low, high = min(values + [1.0]) / 1.3, max(values + [1.0]) * 1.6
    axis.set_xlim(low, high)
    ticks = [2.0**k for k in range(-10, 16) if low <= 2.0**k <= high]
    if len(ticks) < 3:
        ticks = [t for t in (0.5, 0.6, 0.7, 0.8, 0.9, 1, 1.1, 1.2, 1.3, 1.5, 1.75, 2, 2.5, 3)
                 if low <= t <= high]
    axis.xaxis.set_major_locator(FixedLocator(ticks))
    axis.xaxis.set_minor_locator(NullLocator())
    axis.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}x"))
    for y, value in enumerate(values):
        axis.text(value * (1.04 if value >= 1 else 0.96), y, f"{value:.2f}x", va="center",
                  ha="left" if value >= 1 else "right", fontsize=7)
    axis.set_title(title, fontsize=9)
    axis.set_xlabel(f"time / {label} time (log scale; left of 1x is faster)", fontsize=8)
    axis.tick_params(labelsize=7)
