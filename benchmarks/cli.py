"""The command line: `python -m benchmarks [--quick] [--only NAMES] [--json PATH] [--plot PATH]`.

The report (Markdown) goes to stdout, one progress line per case to stderr. On the CPU
backend, dispatch is made synchronous before JAX starts its CPU client, unless
`--async-dispatch` is given: with asynchronous dispatch a tiny jitted call takes about
15 or about 50 us depending on the process, which swamps the differences measured here.
GPU and TPU backends dispatch asynchronously either way; the suite runs on them
unchanged (it uses JAX's default backend).

The clock (`--clock auto`) is this process's CPU time when dispatch is synchronous on the
CPU backend, where it equals the wall time of the work but ignores the time a busy
machine makes the process wait for a core; it is the wall clock everywhere else.
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

__all__ = ["main", "build_parser", "select_cases", "PLANS"]

# mode -> timing plan; the full run takes a few minutes on a 2-core CPU, --quick under one
PLANS: dict[str, Plan] = {
    "full": Plan(rounds=21, sample_s=0.02, warmup=3),
    "quick": Plan(rounds=5, sample_s=0.002, warmup=1),
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
                    "(register_dataclass, flax.struct, equinox, pytreeclass, sepes).",
    )
    parser.add_argument("--quick", action="store_true",
                        help="fewer, shorter rounds (under a minute on a 2-core CPU)")
    parser.add_argument("--only", metavar="NAMES",
                        help="comma-separated case names (exact), or substrings or glob "
                             "patterns of names")
    parser.add_argument("--json", metavar="PATH", help="also write all results as JSON")
    parser.add_argument("--plot", metavar="PATH",
                        help="also write a PNG bar chart of the ratios (needs matplotlib)")
    parser.add_argument("--async-dispatch", action="store_true",
                        help="on CPU, keep JAX's asynchronous dispatch (default: synchronous)")
    parser.add_argument("--clock", choices=("auto", "wall", "cpu"), default="auto",
                        help="wall-clock time, or this process's CPU time (blind to waiting "
                             "for a CPU on a busy machine, but also to waiting for a device); "
                             "auto (default): CPU time on the CPU backend with synchronous "
                             "dispatch, wall time otherwise")
    parser.add_argument("--rounds", type=int, metavar="N", help="override the number of rounds")
    parser.add_argument("--seed", type=int, default=0, help="seed of the shuffled orders")
    parser.add_argument("--list", action="store_true", help="list the case names and exit")
    parser.add_argument("--smoke", action="store_true",
                        help="one single-call round on the smallest models (for the tests; "
                             "numbers are meaningless)")
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
            name == p if p in names else (p in name or fnmatch.fnmatchcase(name, p))
            for p in wanted
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
        return ("asynchronous (the CPU backend had started before the suite could make it "
                "synchronous)", False)
    return ("synchronous (`jax_cpu_enable_async_dispatch=False`, the suite's default on CPU; "
            "`--async-dispatch` keeps JAX's asynchronous dispatch)", True)


def _cpu_dispatch_is_async(jax: Any) -> bool:
    try:
        return bool(jax.config.values["jax_cpu_enable_async_dispatch"])
    except (AttributeError, KeyError):  # an older or newer JAX: report JAX's default
        return True


def main(argv: list[str] | None = None) -> int:
    """Parse `argv`, run the selected cases, print the report; returns the exit status."""
    args = build_parser().parse_args(argv)
    command = "python -m benchmarks" + "".join(
        " " + shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    dispatch, synchronous_cpu = _set_dispatch(args.async_dispatch)
    clock = args.clock if args.clock != "auto" else "cpu" if synchronous_cpu else "wall"
    if clock == "cpu" and not synchronous_cpu:
        print(_CPU_CLOCK_WARNING, file=sys.stderr)

    from .cases import FULL_SIZES, SMOKE_SIZES, all_cases
    from .report import collect_header, format_markdown, plot_ratios, to_json
    from .runner import run_cases

    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    cases = all_cases(SMOKE_SIZES if args.smoke else FULL_SIZES)
    if args.list:
        print("\n".join(f"{case.name}: {case.title}" for case in cases))
        return 0
    try:
        cases = select_cases(cases, args.only)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    plan = dataclasses.replace(PLANS[mode], clock=clock)
    if args.rounds is not None:
        if args.rounds < 1:
            print("--rounds must be at least 1", file=sys.stderr)
            return 2
        plan = dataclasses.replace(plan, rounds=args.rounds)

    results = run_cases(cases, plan, seed=args.seed, progress=sys.stderr)
    header = collect_header(dispatch, plan, mode, command)
    sys.stdout.write(format_markdown(header, results))
    sys.stdout.flush()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(to_json(header, results), out, indent=1)
    if args.plot:
        reason = plot_ratios(results, args.plot)
        if reason is not None:
            print(reason, file=sys.stderr)
    wrong = [f"{r.case.name}: {row.name}" for r in results for row in r.entries
             if row.status == "wrong"]
    if wrong:
        print("wrong numbers (not timed): " + "; ".join(wrong), file=sys.stderr)
        return 1
    return 0
