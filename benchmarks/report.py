"""What a run prints and saves: the header, JSON, and Markdown rendered from that JSON.

`to_json` turns a run's results into one JSON-ready dict; every Markdown view is rendered
from that dict, so a saved `--json` file regenerates them all (`benchmarks.publish`):

- `format_markdown`: the whole report (what `python -m benchmarks` prints, and
  benchmarks/RESULTS.md), with the GPU/TPU instructions at its end;
- `format_summary`: the short block that README.md and docs/performance.md show.

Ratios are medians of per-round ratios (see `timing`), so a row's "vs floor" is not its
median time divided by the floor's median time, though the two are usually close.
Verdicts and their intervals come from `stats`.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
from typing import Any

from .cases import FASTEST_KINDS
from .runner import CaseResult, EntryResult, beside_ratios, paired_baseline, target_verdict
from .scaling import LINEAR_LIMIT, ScalingResult, above_linear
from .stats import CONFIDENCE, MET, MISSED
from .timing import Plan, median_ratio

__all__ = [
    "ARCHITECTURE_DOC",
    "collect_header",
    "evaluate_target",
    "format_markdown",
    "format_summary",
    "growth_verdict",
    "plot_names",
    "run_label",
    "scope_remark",
    "to_json",
]

ARCHITECTURE_DOC = "docs/architecture.md"
_VERSIONED = (
    "jax",
    "jaxlib",
    "numpy",
    "treeclass",
    "optax",
    "equinox",
    "flax",
    "pytreeclass",
    "sepes",
    "safetensors",
    "orbax-checkpoint",
    "matplotlib",
)


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        if distribution == "treeclass":  # run from a source tree, not installed
            import treeclass

            return f"{treeclass.__version__} (source tree)"
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


def collect_header(
    dispatch: str, plan: Plan, mode: str, command: str, peak_tflops: float | None = None
) -> dict[str, Any]:
    """The facts a reader needs to compare two runs: machine, backend, versions, method.

    **Arguments**

    - `dispatch`: a sentence saying which dispatch mode ran;
    - `plan`: the timing plan;
    - `mode`: `"full"`, `"quick"` or `"smoke"`;
    - `command`: the command line, as the user would type it;
    - `peak_tflops`: a nominal peak to take model FLOP utilisation against where the
      device's own is not known (`transformer.PEAK_FLOPS`).

    **Returns**

    A JSON-ready dict.
    """
    import jax

    from .transformer import peak_flops

    devices = jax.devices()
    peak = peak_flops(devices[0].device_kind, peak_tflops)
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
        "peak_flops": None if peak is None else {"flops": peak[0], "source": peak[1]},
        "versions": {name: _version(name) for name in _VERSIONED},
        "timing": {
            "rounds": plan.rounds,
            "sample_s": plan.sample_s,
            "warmup_calls": plan.warmup,
            "calibrated": plan.calibrate,
            "clock": plan.clock,
            "remeasures": plan.remeasures,
            "remeasure_rounds": plan.rounds * plan.remeasure_factor,
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


def _shown(kind: str, value: float) -> str:
    return f"{value:.1f}x faster" if kind == "min_speedup" else f"{value:.2f}x"


def _untimed_reason(result: CaseResult) -> tuple[str, str]:
    """Why a target went unmeasured: a short phrase, and the row's own note."""
    tc = result.by_role("treeclass")
    if tc is None or tc.status != "ok":
        status = (
            "missing" if tc is None else {"unavailable": "not available"}.get(tc.status, tc.status)
        )
        return f"not measured (treeclass {status})", tc.note if tc is not None else ""
    return f"not measured ({', '.join(result.case.target.baselines)} not timed)", ""


def evaluate_target(result: CaseResult, mode: str = "full") -> dict[str, Any] | None:
    """The case's target against this run: the verdict, its interval, and a sentence.

    **Arguments**

    - `result`: a case that ran;
    - `mode`: `"quick"` labels the verdict as indicative, `"smoke"` as not meaningful.

    **Returns**

    `None` for a case without a target, else a dict with `status` (`"met"`, `"missed"`,
    `"within noise"`, or `None` when not measured, then `reason` says why), `met` (True,
    False or None), `measured`, `low`, `high`, `margin`, `rounds`, `extra_rounds`,
    `summary`, and for a target against "the fastest of" several baselines `paired_with`,
    the one treeclass was paired with.
    """
    target = result.case.target
    if target is None:
        return None
    out: dict[str, Any] = {
        "text": target.text,
        "kind": target.kind,
        "limit": target.limit,
        "baselines": list(target.baselines),
        "statistic": target.statistic,
        "status": None,
        "met": None,
        "measured": None,
        "low": None,
        "high": None,
        "margin": None,
        "rounds": None,
        "extra_rounds": result.extra_rounds,
        "indicative": mode != "full",
    }
    verdict = target_verdict(result) if result.status == "ran" else None
    if verdict is not None and target.kind in FASTEST_KINDS:
        out["paired_with"] = paired_baseline(result)
    if verdict is None:
        out["summary"], out["reason"] = (
            ("skipped", result.note) if result.status != "ran" else _untimed_reason(result)
        )
        return out
    interval = (
        f"{_shown(target.kind, verdict.measured)}; {CONFIDENCE:.0%} interval "
        f"{verdict.low:.2f}-{verdict.high:.2f}"
    )
    if target.statistic == "best":
        interval += ", of each implementation's fastest sample"
    if verdict.status == MET:
        words = f"met by {verdict.margin:.0%} ({interval}"
    elif verdict.status == MISSED:
        words = f"missed by {-verdict.margin:.0%} ({interval}"
    else:
        words = f"within noise ({interval} straddles {target.limit:g}"
    more = f"; after {result.extra_rounds} more rounds" if result.extra_rounds else ""
    prefix = {"quick": "indicative: ", "smoke": "smoke, not meaningful: "}.get(mode, "")
    out.update(
        status=verdict.status,
        met={MET: True, MISSED: False}.get(verdict.status),
        measured=verdict.measured,
        low=verdict.low,
        high=verdict.high,
        margin=verdict.margin,
        rounds=verdict.rounds,
        summary=f"{prefix}{words}{more}; target {target.text})" + _beside_words(result),
    )
    return out


def _beside_text(item: dict[str, Any]) -> str:
    if item["measured"] is None:
        return f"{item['label']}: not measured"
    return (
        f"{item['label']}: {item['measured']:.2f}x ({CONFIDENCE:.0%} interval "
        f"{item['low']:.2f}-{item['high']:.2f}, {item['rounds']} paired rounds)"
    )


def _beside_words(result: CaseResult) -> str:
    """The `beside` ratios as a sentence after a verdict, or `""`."""
    items = beside_ratios(result)
    return "; beside it, " + "; ".join(_beside_text(i) for i in items) if items else ""


def _published(result: CaseResult) -> list[dict[str, Any]]:
    rows = []
    for numerator, denominator, value in result.case.published:
        a, b = result.timed(numerator), result.timed(denominator)
        ours = median_ratio(a, b) if a is not None and b is not None else None
        rows.append({"ratio": f"{numerator} / {denominator}", "published": value, "ours": ours})
    for numerator in ("flax.struct", "equinox (filter_jit)"):
        a, b = result.timed(numerator), result.timed("treeclass")
        if result.case.published and a is not None and b is not None:
            rows.append(
                {"ratio": f"{numerator} / treeclass", "published": None, "ours": median_ratio(a, b)}
            )
    return rows


# -- JSON: the one source every view renders from ---------------------------------------------


def to_json(
    header: dict[str, Any], results: list[CaseResult], scaling: list[ScalingResult] | None = None
) -> dict[str, Any]:
    """Everything measured, for machines to compare runs (times in seconds)."""
    mode = header["mode"]
    cases = []
    for result in results:
        tc, floor = _timed(result, "treeclass"), _timed(result, "floor")
        rows = []
        for row in result.entries:
            rows.append(
                {
                    "name": row.name,
                    "role": row.role,
                    "owner": row.owner,
                    "status": row.status,
                    "note": row.note,
                    "number": row.series.number if row.series is not None else None,
                    "median_s": row.series.median if row.series is not None else None,
                    "times_s": list(row.series.times) if row.series is not None else [],
                    "vs_treeclass": _ratio(row, tc),
                    "vs_floor": _ratio(row, floor),
                }
            )
        case = result.case
        cases.append(
            {
                "name": case.name,
                "group": case.group,
                "title": case.title,
                "note": case.note,
                "status": result.status,
                "skip_reason": result.note,
                "seconds": result.seconds,
                "rate": list(case.rate) if case.rate else None,
                "work": case.work,
                "scope": case.scope,
                "mode": mode,
                "target": evaluate_target(result, mode),
                "published": _published(result) if result.status == "ran" else [],
                "published_note": case.published_note,
                "extra": result.extra,
                "beside": beside_ratios(result),
                "rows": rows,
            }
        )
    return {
        "header": header,
        "cases": cases,
        "scaling": [_scaling_json(s) for s in (scaling or [])],
    }


def _scaling_json(result: ScalingResult) -> dict[str, Any]:
    floor = result.floor
    return {
        "name": result.case.name,
        "title": result.case.title,
        "note": result.case.note,
        "status": result.status,
        "skip_reason": result.note,
        "sizes": list(result.case.sizes),
        "unit": result.case.unit,
        "reused_sizes": result.reused,
        "seconds": result.seconds,
        "floor_k": floor.k if floor is not None else None,
        "floor_k_last": floor.k_last if floor is not None else None,
        "treeclass_k_over_floor": result.k_over_floor(),
        "rows": [
            {
                "name": row.name,
                "role": row.role,
                "times_s": {str(n): t for n, t in sorted(row.times.items())},
                "k": row.k,
                "k_last": row.k_last,
                "notes": row.notes,
            }
            for row in result.rows
        ],
    }


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


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _row_note(row: dict[str, Any]) -> str:
    status, note = row["status"], row["note"]
    if status == "ok":
        return note
    peer = row["owner"] == "peer"
    label = {
        "skipped": "skipped",
        "unavailable": "not available",
        "failed": "peer failed (the peer's error; not counted against treeclass)"
        if peer
        else "FAILED",
        "wrong": "peer gave different numbers (not timed; not counted against treeclass)"
        if peer
        else "WRONG NUMBERS",
    }[status]
    return f"{label}: {note}" if note else label


def _method(header: dict[str, Any]) -> str:
    timing = header["timing"]
    if not timing["calibrated"]:
        return f"smoke mode: {timing['rounds']} round of single calls (numbers are not meaningful)"
    clock = (
        "wall time"
        if timing["clock"] == "wall"
        else "this process's CPU time, which equals wall time for synchronous CPU work but "
        "ignores time spent waiting for a CPU on a busy machine (`--clock wall` for wall "
        "time)"
    )
    warmups = timing["warmup_calls"]
    return (
        f"median of {timing['rounds']} rounds; in each round every implementation runs "
        f"one sample (~{timing['sample_s'] * 1e3:g} ms of back-to-back calls) in a fresh "
        f"shuffled order; {warmups} warm-up call{'' if warmups == 1 else 's'} first; gc "
        f"paused during samples; clock: {clock}. Cases that say so in their notes use "
        "fewer rounds, one call per sample or the wall clock (training loop, checkpoints, "
        "scaling)"
    )


def _definitions(header: dict[str, Any]) -> list[str]:
    timing = header["timing"]
    remeasure = (
        f"a case whose interval straddles its limit is first measured again, "
        f"{timing['remeasure_rounds']} more rounds of its treeclass and baseline "
        f"rows, up to {timing['remeasures']} time(s)"
        if timing.get("remeasures")
        else "this mode does not re-measure"
    )
    return [
        "- columns: *median* is one call's time, the median over rounds; *vs treeclass* and "
        "*vs floor* are medians of per-round ratios of the row's time to the treeclass row's "
        "and to the plain dict/list row's (the floor), lower is faster; *target* gives the "
        f"treeclass row's verdict against its speed target ({ARCHITECTURE_DOC}) and marks "
        "the rows that target compares against; *note* says how each library does it",
        f"- verdicts: the {CONFIDENCE:.0%} interval is a bootstrap of the median per-round "
        "ratio (resampled rounds). *met*: the whole interval is on the target's side of the "
        "limit; *missed*: wholly on the other side; *within noise*: it straddles the limit "
        f"({remeasure}). *met by X%* / *missed by X%*: the median is X% of the limit inside "
        "/ outside it (1.00x against <= 1.10x is met by 9%). *The fastest of* several "
        "baselines is the one with the lowest median, paired with treeclass in every round",
        "- failures: a peer that raises or gives different numbers is labelled as the "
        "peer's and is never counted against treeclass; only treeclass's or the floor's "
        "wrong numbers make the command exit with status 1",
    ]


def format_markdown(data: dict[str, Any]) -> str:
    """The whole report as Markdown, from `to_json`'s dict (or a saved `--json` file)."""
    header = data["header"]
    versions = ", ".join(f"{k} {v}" for k, v in header["versions"].items())
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
        f"- peak for MFU: {_peak_line(header)}",
        f"- versions: {versions}",
        f"- method: {_method(header)}",
        *_definitions(header),
        *_merged_lines(header),
    ]
    if header["mode"] == "quick":
        lines.append(
            "- **`--quick` run: few, short rounds; every verdict is indicative only.** "
            "Run without `--quick` for figures to publish"
        )
    lines.append("")
    group = None
    for case in data["cases"]:
        if case["group"] != group:
            group = case["group"]
            lines += [f"## {group}", ""]
        lines += _case_markdown(case, header)
    lines += _scaling_markdown(data.get("scaling", []))
    lines += _targets_markdown(data["cases"], header)
    lines += GPU_SECTION.splitlines()
    return "\n".join(lines).rstrip() + "\n"


def _peak_line(header: dict[str, Any]) -> str:
    peak = header.get("peak_flops")
    if not peak:
        return (
            f"not known for {header.get('device_kind', 'this device')} (MFU reads n/a; "
            "`--peak-tflops` states a nominal one)"
        )
    return f"{peak['flops'] / 1e12:g} TFLOP/s ({peak['source']})"


def _merged_lines(header: dict[str, Any]) -> list[str]:
    return [
        f"- merged in ({item['date']}, {item['mode']}, load average "
        f"{item.get('load_average', 'unknown')}): `{item['command']}`: "
        + ", ".join(f"`{name}`" for name in item["cases"])
        for item in header.get("merged", [])
    ]


def _rate_cells(case: dict[str, Any], row: dict[str, Any], header: dict[str, Any]) -> list[str]:
    """steps/s (or the case's unit), and for a case with `work` tokens/s and MFU."""
    rate, work, median = case["rate"], case.get("work"), row["median_s"]
    if not rate:
        return []
    cells = [_rate(rate[1] / median) if median else "—"]
    if work:
        peak = (header.get("peak_flops") or {}).get("flops")
        cells.append(_rate(work["tokens"] / median) if median else "—")
        cells.append(f"{work['flops'] / median / peak:.1%}" if median and peak else "n/a")
    return cells


def _case_markdown(case: dict[str, Any], header: dict[str, Any]) -> list[str]:
    lines = [f"### `{case['name']}`: {case['title']}", ""]
    if case["status"] == "skipped":
        return [*lines, f"Skipped: {case['skip_reason']}", ""]
    target = case["target"]
    rate = case["rate"]
    work = rate and case.get("work")
    head = [
        "implementation",
        "median",
        *([rate[0]] if rate else []),
        *(["tokens/s", "MFU"] if work else []),
        "vs treeclass",
        "vs floor",
        "target",
        "note",
    ]
    lines += [
        "| " + " | ".join(head) + " |",
        "|---|---:|"
        + ("---:|" if rate else "")
        + ("---:|---:|" if work else "")
        + "---:|---:|---|---|",
    ]
    fastest = (target or {}).get("paired_with")  # set for "the fastest of" targets
    for row in case["rows"]:
        name = f"**{row['name']}**" if row["role"] == "treeclass" else row["name"]
        if row["role"] == "floor":
            name += " (floor)"
        target_cell = ""
        if target is not None:
            if row["role"] == "treeclass":
                target_cell = target["summary"]
            elif row["name"] == fastest:
                target_cell = "target baseline (the fastest, by median)"
            elif row["name"] in target["baselines"]:
                target_cell = "target baseline" if fastest is None else "candidate baseline"
        rate_cells = _rate_cells(case, row, header)
        cells = [
            name,
            _seconds(row["median_s"]),
            *rate_cells,
            _times(row["vs_treeclass"]),
            _times(row["vs_floor"]),
            target_cell,
            _row_note(row),
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    if case["published"]:
        lines += ["", "| ratio | published | this run |", "|---|---:|---:|"]
        for item in case["published"]:
            shown = f"{item['published']:.3f}" if item["published"] is not None else "—"
            ours = f"{item['ours']:.3f}" if item["ours"] is not None else "—"
            lines.append(f"| {item['ratio']} | {shown} | {ours} |")
        lines += ["", case["published_note"]]
    for item in case.get("beside") or []:
        lines += ["", f"Beside the target (no target of its own): {_beside_text(item)}."]
    if case["note"]:
        lines += ["", case["note"]]
    if case["extra"]:
        lines += _memory_markdown(case["extra"])
    return [*lines, ""]


def _mib(value: float | None) -> str:
    return "—" if value is None else f"{value / 2**20:.1f} MiB"


def _memory_markdown(extra: dict[str, Any]) -> list[str]:
    if "error" in extra:
        return ["", f"Peak memory not measured: {extra['error']}"]
    if "heading" not in extra and "XLA's plan" in extra.get("action", ""):
        # a fine-tune table saved before it said its own measure: the same figures
        extra = {
            **extra,
            "heading": "Device memory XLA plans for one compiled LoRA train step "
            "(`compiled.memory_analysis()`), against the frozen base of "
            f"{_mib(extra['largest_leaf'])} (all its leaves):",
            "column": "planned device peak",
            "per": "x frozen base",
            "reference_bytes": extra["largest_leaf"],
        }
    if "heading" in extra:
        # a table that says its own measure (a device program's plan, against a base)
        leaf = extra["reference_bytes"]
        heading, column, per = extra["heading"], extra["column"], extra["per"]
    else:
        leaf = extra["largest_leaf"]
        heading = (
            f"Peak extra host memory of one {extra.get('action', 'save')} (largest leaf "
            f"{_mib(leaf)}; header {extra['header'] if extra['header'] is not None else '—'} "
            "bytes):"
        )
        column, per = "peak extra", "x largest leaf"
    lines = [
        "",
        heading,
        "",
        f"| implementation | {column} | {per} | note |",
        "|---|---:|---:|---|",
    ]
    for row in extra["rows"]:
        multiple = "—" if row["extra"] is None else f"{row['extra'] / leaf:.2f}x"
        name = f"**{row['name']}**" if row["name"] == "treeclass" else row["name"]
        lines.append(f"| {name} | {_mib(row['extra'])} | {multiple} | {_cell(row['note'])} |")
    target = extra["target"]
    how = extra.get("how") or (
        f"{extra['method'] or 'no method available'}, in a fresh interpreter per "
        "implementation, minus the resident memory just before the save"
    )
    lines += ["", f"Target: {target['text']}: {target['summary']}. Measured as {how}."]
    return lines


def _k(value: float | None, flag: bool = False) -> str:
    if value is None:
        return "—"
    text = f"{value:.2f}"
    return f"**{text}** (above {LINEAR_LIMIT:g})" if flag and above_linear(value) else text


def _scaling_markdown(scaling: list[dict[str, Any]]) -> list[str]:
    if not scaling:
        return []
    lines = [
        "## Scaling: how cost grows with the number of layers",
        "",
        "Median time of one call per size; *k* is the slope of a least-squares line "
        "through log(time) against log(layers) (cost ~ n^k: 1 is linear, 2 quadratic); "
        "*k, last step* is the slope between the two largest sizes timed. A treeclass "
        f"exponent above {LINEAR_LIMIT:g} is flagged in bold; the floor's exponent shows "
        "what JAX itself does at that size, and *relative to the floor* is the slope of "
        "treeclass's time over the floor's (0: treeclass grows exactly as plain dicts "
        "under the same JAX call do), what the tree library itself adds.",
        "",
    ]
    for case in scaling:
        lines += [f"### `{case['name']}`: {case['title']}", ""]
        if case["status"] == "skipped":
            lines += [f"Skipped: {case['skip_reason']}", ""]
            continue
        sizes = case["sizes"]
        lines += [
            "| implementation | "
            + " | ".join(f"n={n:,}" for n in sizes)
            + " | k | k, last step | note |",
            "|---|" + "---:|" * (len(sizes) + 2) + "---|",
        ]
        for row in case["rows"]:
            mine = row["role"] == "treeclass"
            name = f"**{row['name']}**" if mine else row["name"]
            if row["role"] == "floor":
                name += " (floor)"
            times = [_seconds(row["times_s"].get(str(n))) for n in sizes]
            cells = [
                name,
                *times,
                _k(row["k"], mine),
                _k(row["k_last"], mine),
                "; ".join(row["notes"]),
            ]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        unit = case.get("unit", "layers")
        notes = [] if unit == "layers" else [f"n counts {unit}"]
        notes += [case["note"]] if case["note"] else []
        if case["reused_sizes"]:
            notes.append(
                "n = "
                + ", ".join(f"{n:,}" for n in case["reused_sizes"])
                + ": the main case's own measurement in this run"
            )
        if notes:
            lines += ["", "; ".join(notes) + "."]
        lines.append("")
    lines += _exponents_table(scaling)
    return lines


def _exponents_table(scaling: list[dict[str, Any]], heading: bool = True) -> list[str]:
    lines = ["### Exponents at a glance", ""] if heading else []
    lines += [
        "| case | treeclass k | treeclass k, last step | floor k | floor k, last step | "
        "treeclass relative to the floor | treeclass | "
        f"above k = {LINEAR_LIMIT:g} |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for case in scaling:
        if case["status"] == "skipped":
            lines.append(f"| `{case['name']}` | — | — | — | — | — | — | skipped |")
            continue
        rows = {row["name"]: row for row in case["rows"]}
        tc = rows.get("treeclass", {})
        relative = case.get("treeclass_k_over_floor")
        above = [
            f"{row['name']} ({row['k']:.2f})" for row in case["rows"] if above_linear(row["k"])
        ]
        shown_relative = "—" if relative is None else f"{relative:+.2f}"
        lines.append(
            f"| `{case['name']}` | {_k(tc.get('k'), True)} | "
            f"{_k(tc.get('k_last'), True)} | {_k(case['floor_k'])} | "
            f"{_k(case.get('floor_k_last'))} | {shown_relative} | "
            f"{growth_verdict(tc.get('k'), relative)} | "
            f"{_cell(', '.join(above)) or 'none'} |"
        )
    return [*lines, ""]


def growth_verdict(k: float | None, relative: float | None) -> str:
    """How treeclass grows: *linear* (k <= the limit), *as the floor* (k above it, but no
    faster than plain dicts under the same JAX call: its slope relative to the floor is at
    most the limit's excess over 1), else *above linear*."""
    if k is None:
        return "—"
    if not above_linear(k):
        return "linear"
    if relative is not None and round(relative, 2) <= round(LINEAR_LIMIT - 1, 2):
        return "as the floor (JAX's own growth)"
    return "**above linear**"


def scope_remark(case: dict[str, Any], backend: str) -> str:
    """What a case's figure on `backend` means, when its scope says it differs: an
    accelerator's target seen on the CPU, or a pure-Python (or eager) case off the CPU."""
    scope = case.get("scope", "")
    if scope == "accelerator" and backend == "cpu":
        return "an accelerator's target: judged on the accelerator's run, shown here for reference"
    if scope == "host" and backend != "cpu":
        return "pure Python: this figure measures the host's CPU, not the device"
    if scope == "eager" and backend != "cpu":
        return "eager: one device dispatch per array operation, mostly the host's round trips"
    return ""


def _verdict_cell(target: dict[str, Any], mode: str, remark: str = "") -> str:
    if target["status"] is None:
        return target["summary"]
    status = target["status"]
    judged_elsewhere = remark.startswith("an accelerator's target")
    word = {
        MET: f"met by {target['margin']:.0%}",
        MISSED: f"**missed** by {-target['margin']:.0%}",
    }.get(status, "within noise")
    if judged_elsewhere:
        word = {MET: "met here", MISSED: "not met here"}.get(status, "within noise here")
    remarks = [f"after {target['extra_rounds']} more rounds"] if target["extra_rounds"] else []
    remarks += {"quick": ["indicative"], "smoke": ["smoke"]}.get(mode, [])
    remarks += [remark] if remark else []
    return f"{word} ({'; '.join(remarks)})" if remarks else word


def _measured_cell(target: dict[str, Any]) -> tuple[str, str]:
    if target["status"] is None:
        return "—", "—"
    return _shown(target["kind"], target["measured"]), f"{target['low']:.2f}-{target['high']:.2f}"


def _targets_rows(cases: list[dict[str, Any]], header: dict[str, Any]) -> list[str]:
    rows = []
    for case in cases:
        target = case["target"]
        if target is None:
            continue
        mode = case.get("mode") or header["mode"]
        remark = scope_remark(case, header["backend"])
        if target["status"] is None:
            reason = f": {target['reason']}" if target.get("reason") else ""
            rows.append(
                f"| `{case['name']}` | {target['text']} | — | — | "
                f"{_cell(target['summary'] + reason)} |"
            )
            continue
        measured, interval = _measured_cell(target)
        rows.append(
            f"| `{case['name']}` | {target['text']} | {measured} | {interval} | "
            f"{_cell(_verdict_cell(target, mode, remark))} |"
        )
        for item in case.get("beside") or []:
            shown = "—" if item["measured"] is None else f"{item['measured']:.2f}x"
            interval = "—" if item["low"] is None else f"{item['low']:.2f}-{item['high']:.2f}"
            rows.append(
                f"| `{case['name']}` (beside) | {_cell(item['label'])} | {shown} | {interval} "
                "| reported beside the target, no target of its own |"
            )
        memory = (case.get("extra") or {}).get("target")
        if memory:
            rows.append(
                f"| `{case['name']}` (memory) | {memory['text']} | — | — | "
                f"{_cell(memory['summary'])} |"
            )
    return rows


def _targets_markdown(cases: list[dict[str, Any]], header: dict[str, Any]) -> list[str]:
    rows = _targets_rows(cases, header)
    if not rows:
        return []
    return [
        f"## Targets ({ARCHITECTURE_DOC})",
        "",
        "*treeclass*: the median paired ratio; *interval*: its "
        f"{CONFIDENCE:.0%} bootstrap interval; *verdict*: met, missed or within noise "
        "(see the definitions at the top). The stacked-blocks targets are an "
        "accelerator's (a CPU compiles and runs the scanned and unrolled models alike): "
        "a CPU run shows them for reference only. Off the CPU, a pure-Python case "
        "measures the host.",
        "",
        "| case | target | treeclass | interval | verdict |",
        "|---|---|---:|---|---|",
        *rows,
        "",
    ]


def run_label(header: dict[str, Any]) -> str:
    """A run's column label: `CPU`, or the backend and device kind (`TPU v5 lite`)."""
    backend = header["backend"]
    if backend == "cpu":
        return "CPU"
    kind = header.get("device_kind", "")
    return kind if kind.lower().startswith(backend) else f"{backend.upper()} ({kind})"


def plot_names(header: dict[str, Any]) -> tuple[str, str]:
    """The ratio and scaling plots' file names of a run (`ratios-cpu.png`, ...)."""
    return f"ratios-{header['backend']}.png", f"scaling-{header['backend']}.png"


def format_summary(
    data: dict[str, Any] | list[dict[str, Any]],
    image_folder: str,
    scaling_plot: bool | set[str] = True,
) -> str:
    """The block README.md and docs/performance.md show: facts, targets, rates, exponents,
    plots, for one run or several side by side (a CPU run and a TPU run, say).

    **Arguments**

    - `data`: `to_json`'s dict (a saved `--json` file), or a list of them, one column each;
    - `image_folder`: where the plots are, relative to the page (`"benchmarks"` from the
      README, `"assets"` from docs/performance.md);
    - `scaling_plot`: whether the scaling plots exist, to show them (or the set of plot
      file names that exist).
    """
    runs = data if isinstance(data, list) else [data]
    labels = [run_label(run["header"]) for run in runs]
    lines = []
    for label, run in zip(labels, runs):
        header = run["header"]
        merged = "".join(
            f"; then `{m['command']}` ({m['date']}, load average "
            f"{m.get('load_average', 'unknown')})"
            for m in header.get("merged", [])
        )
        lines += [
            f"- **{label}**: {header['date']}; {header['machine']}; Python {header['python']}; "
            f"backend {header['backend']} ({header['device_kind']}, "
            f"{header['device_count']} device(s)); load average at the end (1, 5, 15 min): "
            f"{header['load_average']}; command: `{header['command']}`{merged}",
        ]
    lines += [
        "",
        "*treeclass* is the median paired ratio of treeclass's time to the target's "
        f"baseline, with its {CONFIDENCE:.0%} bootstrap interval. *met*: the whole "
        "interval is within the target; *missed*: wholly outside; *within noise*: it "
        "straddles the limit even after re-measuring. *met by X%*: the median is X% of the "
        "limit inside it. *The fastest of* several baselines is the one with the lowest "
        "median time, paired with treeclass in every round. The stacked-blocks targets "
        "are judged on an accelerator (a CPU shows them for reference); off the CPU, a "
        "pure-Python case measures the host.",
        "",
        *_side_by_side_targets(runs, labels),
        "",
    ]
    for label, run in zip(labels, runs):
        lines += _workload_lines(run["cases"], run["header"], label)
    for label, run in zip(labels, runs):
        scaling = [case for case in run.get("scaling", []) if case["status"] == "ran"]
        if scaling:
            lines += [
                f"{label}: how cost grows with the number of layers (cost ~ n^k, fitted over "
                + ", ".join(f"{n:,}" for n in scaling[0]["sizes"])
                + " layers; *last step*: between the two largest):",
                "",
                *_exponents_table(scaling, heading=False),
            ]
    for label, run in zip(labels, runs):
        ratios, scaled = plot_names(run["header"])
        exists = scaling_plot if isinstance(scaling_plot, bool) else scaled in scaling_plot
        has_ratios = True if isinstance(scaling_plot, bool) else ratios in scaling_plot
        if has_ratios:
            lines += [
                f"![{label}: ratios of every implementation to plain dicts, per case]"
                f"({image_folder}/{ratios})",
                "",
            ]
        if run.get("scaling") and exists:
            lines += [
                f"![{label}: time against layers, log-log, per case]({image_folder}/{scaled})",
                "",
            ]
    return "\n".join(lines).rstrip() + "\n"


def _side_by_side_targets(runs: list[dict[str, Any]], labels: list[str]) -> list[str]:
    names: list[str] = []
    by_run: list[dict[str, dict[str, Any]]] = []
    for run in runs:
        cases = {case["name"]: case for case in run["cases"] if case["target"] is not None}
        by_run.append(cases)
        names += [name for name in cases if name not in names]
    head = "| case | target | " + " | ".join(
        f"{label}: treeclass | {label}: verdict" for label in labels
    )
    lines = [head + " |", "|---|---|" + "---:|---|" * len(runs)]
    for name in names:
        text, cells, memory_cells = "", [], []
        for run, cases in zip(runs, by_run):
            case = cases.get(name)
            if case is None:
                cells += ["—", "not run"]
                memory_cells += ["—", "not run"]
                continue
            target, header = case["target"], run["header"]
            text = text or target["text"]
            mode = case.get("mode") or header["mode"]
            measured, interval = _measured_cell(target)
            shown = measured if interval == "—" else f"{measured} ({interval})"
            if target["status"] is None:
                reason = f": {target['reason']}" if target.get("reason") else ""
                cells += ["—", target["summary"] + reason]
            else:
                remark = scope_remark(case, header["backend"])
                cells += [shown, _verdict_cell(target, mode, remark)]
            memory = (case.get("extra") or {}).get("target")
            memory_cells += ["—", memory["summary"] if memory else "—"]
        lines.append(f"| `{name}` | {_cell(text)} | " + " | ".join(_cell(c) for c in cells) + " |")
        memory_text = next(
            (
                (cases[name].get("extra") or {}).get("target", {}).get("text")
                for cases in by_run
                if name in cases and (cases[name].get("extra") or {}).get("target")
            ),
            None,
        )
        if memory_text:
            lines.append(
                f"| `{name}` (memory) | {_cell(memory_text)} | "
                + " | ".join(_cell(c) for c in memory_cells)
                + " |"
            )
    return lines


def _workload_lines(
    cases: list[dict[str, Any]], header: dict[str, Any] | None = None, label: str = ""
) -> list[str]:
    lines = []
    prefix = f"{label}: " if label else ""
    for case in cases:
        if case["rate"] is None or case["status"] != "ran":
            continue
        unit, count = case["rate"]
        work = case.get("work")
        peak = ((header or {}).get("peak_flops") or {}).get("flops")
        rates = []
        for row in case["rows"]:
            median = row["median_s"]
            if not median:
                continue
            figure = f"{row['name']} {_rate(count / median)}"
            if work:
                mfu = f"{work['flops'] / median / peak:.1%} MFU" if peak else "MFU n/a"
                figure += f" ({_rate(work['tokens'] / median)} tokens/s, {mfu})"
            rates.append(figure)
        if rates:
            lines += [
                f"{prefix}`{case['name']}` ({unit}, higher is better): " + ", ".join(rates) + ".",
                "",
            ]
    return lines


GPU_SECTION = """
## Running it on a GPU or TPU

The suite runs on JAX's default backend and has nothing CPU-specific. Start with the real
workloads, the numbers an accelerator user cares about: steps per second of a training
loop whose compute dominates (an MLP raised to width 4096, and the GPT-2-small training
loop, which also reports tokens per second and model FLOP utilisation, and a wider GPT
sized to be compute-bound, whose MFU is the figure to read):

```bash
python3 -m venv .venv && . .venv/bin/activate
pip install -e ".[bench]" "jax[cuda12]"       # NVIDIA GPU (pick the CUDA extra that matches
                                              # the driver); on a TPU VM: pip install "jax[tpu]"
python -c "import jax; print(jax.devices())"  # should list a CUDA (or TPU) device
A=stacked_compile_48_blocks,stacked_step_48_blocks,stacked_init_48_blocks,\\
transformer_training_loop,transformer_compute_bound,workload_training_loop
python -m benchmarks --only $A --workload-width 4096 --workload-batch 4096 \\
    --json benchmarks/results-tpu.json
python -m benchmarks --quick --skip $A --merge-into benchmarks/results-tpu.json \\
    --markdown benchmarks/RESULTS-tpu.md --plot benchmarks/ratios-tpu.png \\
    --scaling-plot benchmarks/scaling-tpu.png
python -m benchmarks.publish benchmarks/results-cpu.json benchmarks/results-tpu.json
```

These are the commands of the published TPU figures (benchmarks/results-tpu.json): the
accelerator's cases in full, the rest with `--quick`, merged into one file (each case
keeps its own mode, and the report lists the merged runs). `--only NAMES --merge-into
FILE` adds or re-measures single cases in an earlier run's file the same way.

What differs from the CPU run:

- The header says `backend: gpu` (or `tpu`) and the device kind; dispatch is asynchronous
  (the suite's synchronous-dispatch default only applies to the CPU backend) and the clock
  is wall time (`--clock auto`), because CPU time would miss the wait for the device.
- The training loops wait only for their last loss, so the host queues steps ahead of the
  device as a real loop does: the tree layer costs nothing there while the device is the
  bottleneck. MFU is taken against the device's peak where it is known (TPU v5e: 197
  TFLOP/s bf16), else against `--peak-tflops`, else it reads n/a.
- The stacked-blocks targets (compile >= 10x faster than unrolled, step <= 1.1x) are an
  accelerator's: the report judges them on its run and shows a CPU's for reference.
- Every other timed call waits for its result with `block_until_ready`, so each jitted
  call (dispatch, training step, masks under `jit`, frozen leaves) includes one launch
  and synchronization round trip (about 0.6 ms on a TPU v5e), which narrows the ratios
  between implementations. Flatten, construction, `replace` and setting a leaf are pure
  Python: their figures on an accelerator's machine measure its host CPU. Eager cases
  (masks, leafwise arithmetic, applying a function) are mostly dispatch round trips.
- Checkpoints move every array from the device to the host to save, and back to load;
  the peak-memory children of the checkpoint case run on the CPU backend (a TPU is held
  by one process, the suite's).
- `JAX_PLATFORMS=cpu python -m benchmarks` runs the CPU suite on the same machine, and
  the `--json` files of two runs can be compared row by row (each row keeps its per-round
  times and ratios).
"""
