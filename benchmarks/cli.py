"""The command line: `python -m benchmarks [--quick] [--only NAMES] [--json PATH] ...`.

The report (Markdown) goes to stdout, one progress line per case to stderr. On the CPU
backend, dispatch is made synchronous before JAX starts its CPU client, unless
`--async-dispatch` is given: with asynchronous dispatch a tiny jitted call takes about
15 or about 50 us depending on the process, which swamps the differences measured here.
GPU and TPU backends dispatch asynchronously either way; the suite runs on them
unchanged (it uses JAX's default backend).

The clock (`--clock auto`) is this process's CPU time when dispatch is synchronous on the
CPU backend, where it equals the wall time of the work but ignores the time a busy
machine makes the process wait for a core; it is the wall clock everywhere else. The
training loop and the checkpoints always use the wall clock (they use several threads).

What runs, per mode (`--list` names every case):

- full (the default): the real workloads (an MLP training loop and a GPT training loop),
  every main case and the scaling section (10 to 10,000 layers); about 8 minutes on an
  idle 2-core CPU, nearly half of it scaling (compiling a 1,000-layer train step eight
  times, printing 10,000 layers) and compiling the stacked-blocks and GPT models.
- `--quick`: the same with fewer, shorter rounds and scaling up to 1,000 layers; about
  3 minutes on an idle 2-core CPU, half of it compiling the stacked-blocks and GPT
  models; its verdicts are labelled indicative.
- `--smoke`: one single-call round on the smallest models (the tests' mode).
- `--checkpoint-mb 1024` adds the checkpoint cases (1 GiB saved and loaded by five tools,
  and each save's peak memory in a fresh interpreter): several minutes, so only on request.

To regenerate the published figures (benchmarks/RESULTS.md, the README's "Benchmarks"
section, docs/performance.md and the plots) from one full run, on an idle machine:

```bash
python -m benchmarks --checkpoint-mb 1024 --json benchmarks/results-cpu.json \\
    --markdown benchmarks/RESULTS.md --plot benchmarks/ratios-cpu.png \\
    --scaling-plot benchmarks/scaling-cpu.png
python -m benchmarks.publish benchmarks/results-cpu.json benchmarks/results-tpu.json
```

The TPU figures (benchmarks/results-tpu.json) come from the commands at the end of the
report (`report.GPU_SECTION`); `--only NAMES --merge-into FILE` measures single cases into
an earlier run's file.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import shlex
import sys
from typing import Any

from .timing import Plan

DEFAULT_CHECKPOINT_MB = 1024

__all__ = ["main", "build_parser", "merge_results", "select_cases", "PLANS"]

# mode -> timing plan
PLANS: dict[str, Plan] = {
    "full": Plan(rounds=21, sample_s=0.02, warmup=3, remeasures=2),
    "quick": Plan(rounds=5, sample_s=0.002, warmup=1, remeasures=1),
    "smoke": Plan(rounds=1, sample_s=0.0, warmup=0, calibrate=False),
}

_NO_MATCH_MSG = (
    "--only {patterns!r} matches no case. Give comma-separated names, substrings or "
    "glob patterns (e.g. --only dispatch,flatten_100*); the cases are:\n  {names}"
)


_CPU_CLOCK_WARNING = (
    "warning: --clock cpu without synchronous CPU dispatch misses the time spent waiting "
    "for a device or for JAX's dispatch threads; use --clock wall (or auto) to time it"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Time treeclass against plain dicts and the installed peers "
        "(register_dataclass, flax.struct, flax.nnx, equinox, pytreeclass, sepes; "
        "safetensors, NumPy and orbax for checkpoints), and how each cost grows "
        "with the number of layers. See benchmarks/README.md.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer, shorter rounds and scaling up to 1,000 layers (about two and a "
        "half minutes on a 2-core CPU; verdicts indicative)",
    )
    parser.add_argument(
        "--only",
        metavar="NAMES",
        help="comma-separated case names (exact), or substrings or glob patterns of names",
    )
    parser.add_argument(
        "--skip",
        metavar="NAMES",
        help="leave out the cases --only would pick with these names (applied after --only)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write all results as JSON")
    parser.add_argument(
        "--markdown", metavar="PATH", help="also write the report (what stdout shows) to PATH"
    )
    parser.add_argument(
        "--plot", metavar="PATH", help="also write a PNG bar chart of the ratios (needs matplotlib)"
    )
    parser.add_argument(
        "--scaling-plot",
        metavar="PATH",
        help="also write a PNG of time against layers, log-log, per scaling "
        "case (needs matplotlib)",
    )
    parser.add_argument(
        "--scaling-sizes",
        metavar="N,N,...",
        help="layer counts of the scaling section (default 10,100,1000,10000; "
        "--quick: 10,100,1000)",
    )
    parser.add_argument(
        "--checkpoint-mb",
        type=float,
        metavar="MB",
        help=f"run the checkpoint cases on a model of MB MiB "
        f"({DEFAULT_CHECKPOINT_MB} for the published figures; they take "
        "minutes, so no run has them unless this is given)",
    )
    parser.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="where the checkpoint cases write (default: /dev/shm where it has "
        "room, so that the disk is not timed; else the temp dir)",
    )
    parser.add_argument(
        "--workload-width",
        type=int,
        metavar="N",
        help="width of the training loop's MLP (default 512; raise it on a GPU "
        "so that compute dominates there too)",
    )
    parser.add_argument(
        "--workload-batch",
        type=int,
        metavar="N",
        help="batch rows of the training loop (default 256)",
    )
    parser.add_argument(
        "--transformer-batch",
        type=int,
        metavar="N",
        help="sequences per step of the GPT training loop (default 4 on an accelerator, "
        "4 on the CPU)",
    )
    parser.add_argument(
        "--peak-tflops",
        type=float,
        metavar="X",
        help="a nominal peak (TFLOP/s) to take model FLOP utilisation against where the "
        "device's is not known (known: TPU v5e, 197 bf16); without it MFU reads n/a there",
    )
    parser.add_argument(
        "--merge-into",
        metavar="PATH",
        help="merge this run's cases into the earlier --json file PATH (a case or scaling "
        "case of the same name is replaced, a new one added) and write it back; the report "
        "and plots then show the merged results",
    )
    parser.add_argument(
        "--async-dispatch",
        action="store_true",
        help="on CPU, keep JAX's asynchronous dispatch (default: synchronous)",
    )
    parser.add_argument(
        "--clock",
        choices=("auto", "wall", "cpu"),
        default="auto",
        help="wall-clock time, or this process's CPU time (blind to waiting "
        "for a CPU on a busy machine, but also to waiting for a device); "
        "auto (default): CPU time on the CPU backend with synchronous "
        "dispatch, wall time otherwise",
    )
    parser.add_argument("--rounds", type=int, metavar="N", help="override the number of rounds")
    parser.add_argument("--seed", type=int, default=0, help="seed of the shuffled orders")
    parser.add_argument("--list", action="store_true", help="list the case names and exit")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="one single-call round on the smallest models (for the tests; "
        "numbers are meaningless)",
    )
    return parser


def select_cases(cases: list[Any], patterns: str | None) -> list[Any]:
    """The cases picked by the comma-separated `patterns` (all cases when empty).

    A pattern equal to a case name picks that case alone; any other pattern picks every
    case whose name contains it or matches it as a glob. Raises `ValueError` when nothing
    is picked.
    """
    if not patterns:
        return cases
    names = {case.name for case in cases}
    wanted = [p.strip() for p in patterns.split(",") if p.strip()]

    def picked(name: str) -> bool:
        return any(
            name == p if p in names else (p in name or fnmatch.fnmatchcase(name, p)) for p in wanted
        )

    chosen = [case for case in cases if picked(case.name)]
    if not chosen:
        listing = "\n  ".join(case.name for case in cases)
        raise ValueError(_NO_MATCH_MSG.format(patterns=patterns, names=listing))
    return chosen


def _set_dispatch(keep_async: bool) -> tuple[str, bool]:
    """Choose the CPU dispatch mode before JAX starts its backends.

    Returns a sentence saying which mode runs, and whether it is synchronous CPU dispatch
    (where a process's CPU time measures a call as well as the wall clock does).
    """
    import jax

    try:
        from jax._src import xla_bridge

        started = xla_bridge.backends_are_initialized()
    except (ImportError, AttributeError):  # private API: assume we are early enough
        started = False
    if not keep_async and not started:
        jax.config.update("jax_cpu_enable_async_dispatch", False)
    backend = jax.default_backend()
    if backend != "cpu":
        return f"asynchronous ({backend} backend; the CPU dispatch flag does not apply)", False
    if _cpu_dispatch_is_async(jax):
        if keep_async:
            return "asynchronous (JAX's default, kept by `--async-dispatch`)", False
        return (
            "asynchronous (the CPU backend had started before the suite could make it synchronous)",
            False,
        )
    return (
        "synchronous (`jax_cpu_enable_async_dispatch=False`, the suite's default on CPU; "
        "`--async-dispatch` keeps JAX's asynchronous dispatch)",
        True,
    )


def _cpu_dispatch_is_async(jax: Any) -> bool:
    try:
        return bool(jax.config.values["jax_cpu_enable_async_dispatch"])
    except (AttributeError, KeyError):  # an older or newer JAX: report JAX's default
        return True


def _parse_counts(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    counts = tuple(int(part) for part in text.split(",") if part.strip())
    if len(counts) < 2 or min(counts) < 1:
        raise ValueError("--scaling-sizes needs two or more positive layer counts")
    return counts


def _build_cases(args: argparse.Namespace, mode: str) -> tuple[list[Any], list[Any]]:
    """The main cases (workload first, checkpoints last) and the scaling cases of `mode`."""
    from .cases import FULL_SIZES, SMOKE_SIZES
    from .checkpoint import CheckpointSize, checkpoint_cases, size_for_mb
    from .foreign import FULL_FOREIGN, QUICK_FOREIGN, SMOKE_FOREIGN, foreign_case
    from .hfsharded import FULL_HF, QUICK_HF, SMOKE_HF, hf_sharded_case
    from .scaling import scaling_cases
    from .suite import all_cases
    from .workload import WorkloadSize, workload_case

    sizes = SMOKE_SIZES if mode == "smoke" else FULL_SIZES
    if mode == "quick":
        sizes = dataclasses.replace(sizes, gpt="quick")
    if args.transformer_batch:
        sizes = dataclasses.replace(sizes, gpt_batch=args.transformer_batch)
    if mode == "smoke":
        workload = WorkloadSize(width=16, depth=2, batch=8, steps=2)
    else:
        workload = WorkloadSize(steps=2 if mode == "quick" else 10)
    workload = dataclasses.replace(
        workload,
        width=args.workload_width or workload.width,
        batch=args.workload_batch or workload.batch,
    )
    cases = [workload_case(workload), *all_cases(sizes)]
    if mode == "quick":
        cases = [case for case in cases if not case.full_only]
    if mode == "smoke":
        # the plumbing only: a tiny model, and no peak-memory children
        cases += checkpoint_cases(
            CheckpointSize(layers=2, width=16), memory=False, folder=args.checkpoint_dir
        )
    else:
        # a gigabyte saved and loaded by five tools takes minutes: asked for, not default
        if args.checkpoint_mb:
            cases += checkpoint_cases(size_for_mb(args.checkpoint_mb), folder=args.checkpoint_dir)
    foreign = {"smoke": SMOKE_FOREIGN, "quick": QUICK_FOREIGN}.get(mode, FULL_FOREIGN)
    cases.append(foreign_case(foreign, folder=args.checkpoint_dir))
    hf = {"smoke": SMOKE_HF, "quick": QUICK_HF}.get(mode, FULL_HF)
    cases.append(hf_sharded_case(hf, folder=args.checkpoint_dir))
    return cases, scaling_cases(sizes, mode, _parse_counts(args.scaling_sizes))


def main(argv: list[str] | None = None) -> int:
    """Parse `argv`, run the selected cases, print the report; returns the exit status."""
    args = build_parser().parse_args(argv)
    command = "python -m benchmarks" + "".join(
        " " + shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)
    )
    dispatch, synchronous_cpu = _set_dispatch(args.async_dispatch)
    clock = args.clock if args.clock != "auto" else "cpu" if synchronous_cpu else "wall"
    if clock == "cpu" and not synchronous_cpu:
        print(_CPU_CLOCK_WARNING, file=sys.stderr)

    from .report import collect_header, format_markdown, to_json
    from .runner import run_cases
    from .scaling import BUDGET_S, ScalingCase, run_scaling_cases

    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    try:
        cases, scaling = _build_cases(args, mode)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    if args.list:
        print("\n".join(f"{case.name}: {case.title}" for case in [*cases, *scaling]))
        return 0
    try:
        chosen = select_cases([*cases, *scaling], args.only)
        if args.skip:
            left_out = {case.name for case in select_cases(chosen, args.skip)}
            chosen = [case for case in chosen if case.name not in left_out]
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    cases = [case for case in chosen if not isinstance(case, ScalingCase)]
    scaling = [case for case in chosen if isinstance(case, ScalingCase)]
    plan = dataclasses.replace(PLANS[mode], clock=clock)
    if args.rounds is not None:
        if args.rounds < 1:
            print("--rounds must be at least 1", file=sys.stderr)
            return 2
        plan = dataclasses.replace(plan, rounds=args.rounds)

    results = run_cases(cases, plan, seed=args.seed, progress=sys.stderr)
    earlier = {result.case.name: result for result in results}
    scaled = run_scaling_cases(
        scaling, plan, args.seed, BUDGET_S[mode], earlier, progress=sys.stderr
    )
    header = collect_header(dispatch, plan, mode, command, peak_tflops=args.peak_tflops)
    data = to_json(header, results, scaled)
    shown = data
    if args.merge_into:
        try:
            shown = merge_results(_read_json(args.merge_into), data)
        except (OSError, ValueError) as error:
            print(f"--merge-into {args.merge_into}: {error}", file=sys.stderr)
            return 2
    markdown = format_markdown(shown)
    sys.stdout.write(markdown)
    sys.stdout.flush()
    _write_outputs(args, data, shown, markdown)
    return _exit_status(data)


def _read_json(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as file:
        data = json.load(file)
    if not isinstance(data, dict) or "header" not in data or "cases" not in data:
        raise ValueError("not a `python -m benchmarks --json` file (no header and cases)")
    return data


def merge_results(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`base` (an earlier run's JSON) with `new`'s cases and scaling cases merged in.

    A case of `new` replaces the case of `base` with its name, in place; a case `base`
    lacks goes after the last case of its group (at the end for a new group). Each case
    keeps the mode it ran in (`"mode"`), so its verdict stays labelled as its own run's;
    the header keeps `base`'s machine and adds `merged`, one entry (date, command, mode,
    load average, cases) per merged run. Neither input is changed.

    ```python
    from benchmarks.cli import merge_results

    base = {"header": {"mode": "quick"}, "cases": [{"name": "a", "group": "1"}]}
    new = {"header": {"mode": "full", "date": "d", "command": "c"},
           "cases": [{"name": "b", "group": "1"}]}
    merged = merge_results(base, new)
    assert [c["name"] for c in merged["cases"]] == ["a", "b"]
    assert merged["cases"][1]["mode"] == "full" and base["cases"][0].get("mode") is None
    ```
    """
    base_mode, new_mode = base["header"].get("mode"), new["header"].get("mode")
    cases = [{"mode": base_mode, **case} for case in base["cases"]]
    for case in new["cases"]:
        case = {**case, "mode": case.get("mode", new_mode)}
        names = [old["name"] for old in cases]
        if case["name"] in names:
            cases[names.index(case["name"])] = case
            continue
        groups = [i for i, old in enumerate(cases) if old.get("group") == case.get("group")]
        cases.insert(groups[-1] + 1 if groups else len(cases), case)
    scaling = list(base.get("scaling", []))
    for case in new.get("scaling", []):
        names = [old["name"] for old in scaling]
        if case["name"] in names:
            scaling[names.index(case["name"])] = case
        else:
            scaling.append(case)
    header = dict(base["header"])
    header["merged"] = [
        *base["header"].get("merged", []),
        {
            "date": new["header"].get("date"),
            "command": new["header"].get("command"),
            "mode": new_mode,
            "load_average": new["header"].get("load_average"),
            "cases": [case["name"] for case in [*new["cases"], *new.get("scaling", [])]],
        },
    ]
    return {**base, "header": header, "cases": cases, "scaling": scaling}


def _write_outputs(
    args: argparse.Namespace, data: dict[str, Any], shown: dict[str, Any], markdown: str
) -> None:
    from .plots import plot_ratios, plot_scaling

    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=1)
    if args.merge_into:
        with open(args.merge_into, "w", encoding="utf-8") as out:
            json.dump(shown, out, indent=1)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as out:
            out.write(markdown)
    for path, plot in ((args.plot, plot_ratios), (args.scaling_plot, plot_scaling)):
        if path:
            reason = plot(shown, path)
            if reason is not None:
                print(reason, file=sys.stderr)


def _exit_status(data: dict[str, Any]) -> int:
    """1 when treeclass or the floor gave wrong numbers; a peer's wrong numbers are noted."""
    wrong = {"ours": [], "peers": []}
    for case in data["cases"]:
        for row in case["rows"]:
            if row["status"] == "wrong":
                side = "peers" if row["owner"] == "peer" else "ours"
                wrong[side].append(f"{case['name']}: {row['name']}")
    for case in data.get("scaling", []):
        for row in case["rows"]:
            for note in row["notes"]:
                if "gave different numbers" in note:
                    side = "peers" if row["role"] == "peer" else "ours"
                    wrong[side].append(f"{case['name']}: {row['name']} ({note.split(':')[0]})")
    if wrong["peers"]:
        print(
            "peers that gave different numbers (not timed, not counted against treeclass): "
            + "; ".join(wrong["peers"]),
            file=sys.stderr,
        )
    if wrong["ours"]:
        print("wrong numbers (not timed): " + "; ".join(wrong["ours"]), file=sys.stderr)
        return 1
    return 0
