"""Scaling: how the cost of each operation grows with the number of layers.

Each scaling case times one operation on MLPs of 10, 100, 1,000 and 10,000 layers
(`--quick` stops at 1,000) for treeclass and every peer that has the operation, and fits
the exponent `k` of `time ~ n ** k` per implementation (`stats.fit_exponent`): 1 is
linear, 2 quadratic. A second exponent, between the two largest sizes, shows the growth
where it matters most, without the fixed cost that flattens the small sizes.

At each size the case runs through `runner.run_case`, so the implementations are
checked against each other before they are timed, and a peer that fails at one size is
labelled at that size. An implementation whose next size would take too long (its
time so far, grown at its exponent so far, but at least linearly, times the rounds) is
not timed at the larger sizes, with a note; its exponent rests on the sizes it ran.

Two operations are sized down on purpose:

- *jit dispatch* calls `jax.jit(lambda model, x: x * 2, keep_unused=True)`: every leaf
  is flattened, checked and handed to the executable as in any call, but the program is
  trivial, because compiling a forward pass over 10,000 layers takes many minutes;
- the *jitted train step* (the SGD step of section 3) stops at 1,000 layers (100 in
  `--quick`): compiling it takes about 20 s per implementation at 1,000 layers and
  minutes at 10,000. Its 10- and 100-layer points are section 3's own results when
  those cases ran in the same process.

One case is not counted in layers: the compile of the stacked-blocks model's train step
(section 7) at 12, 48 and 96 blocks, where the stack should compile in a time flat in N.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import jax

from .cases import (
    Case,
    Entry,
    Kit,
    Sizes,
    _batch,
    _model,
    _per_kit,
    apply_selector_case,
    flatten_layers_case,
    hand_written,
    set_deep_case,
    train_step_case,
)
from .peers import get_kit
from .runner import CaseResult, run_case
from .stacked import StackSize, compile_case
from .stats import fit_exponent
from .timing import Plan, one_call_per_sample

__all__ = [
    "LINEAR_LIMIT",
    "above_linear",
    "relative_exponent",
    "SCALING_SIZES",
    "STACKED_BLOCKS",
    "ScalingCase",
    "ScalingResult",
    "ScalingRow",
    "flagged",
    "run_scaling",
    "run_scaling_cases",
    "scaling_cases",
]

# the sizes per mode; the train step stops at its own largest size (compile time)
SCALING_SIZES: dict[str, tuple[int, ...]] = {
    "full": (10, 100, 1_000, 10_000),
    "quick": (10, 100, 1_000),
    "smoke": (2, 4, 8),
}
_TRAIN_STEP_LARGEST = {"full": 1_000, "quick": 100, "smoke": 4}
# the stacked model's compile is counted in blocks (section 7's case at 48; smoke: 4)
STACKED_BLOCKS: dict[str, tuple[int, ...]] = {
    "full": (12, 48, 96),
    "quick": (12, 48, 96),
    "smoke": (2, 4),
}
# seconds one implementation may take at one size before it is left out of larger ones
BUDGET_S: dict[str, float] = {"full": 20.0, "quick": 1.5, "smoke": math.inf}
LINEAR_LIMIT = 1.1


def above_linear(k: float | None) -> bool:
    """Whether an exponent, as shown (two decimals), exceeds `LINEAR_LIMIT`."""
    return k is not None and round(k, 2) > LINEAR_LIMIT


@dataclass
class ScalingCase:
    """One operation timed at several sizes.

    - `case_at(n)`: the `Case` at size `n` (no target: scaling has no verdicts);
    - `sizes`: the sizes, ascending, counted in `unit` (`"layers"`, or `"blocks"`);
    - `reuse(n)`: the name of a main case timing the same operation at size `n`, whose
      result is used when it ran in the same process;
    - `budget_s`: the least number of seconds an implementation may be projected to
      take at the next size before it is left out (the run's own budget when that is
      larger): a case of seconds-long calls raises it.
    """

    name: str
    title: str
    case_at: Callable[[int], Case]
    sizes: tuple[int, ...]
    reuse: Callable[[int], str] | None = None
    note: str = ""
    budget_s: float = 0.0
    unit: str = "layers"


@dataclass
class ScalingRow:
    """One implementation: median time per size, the fitted exponents, notes."""

    name: str
    role: str
    times: dict[int, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def k(self) -> float | None:
        """The least-squares exponent over every size timed (at least two)."""
        if len(self.times) < 2:
            return None
        sizes = sorted(self.times)
        return fit_exponent(sizes, [self.times[n] for n in sizes])

    @property
    def k_last(self) -> float | None:
        """The exponent between the two largest sizes timed."""
        if len(self.times) < 2:
            return None
        a, b = sorted(self.times)[-2:]
        return fit_exponent([a, b], [self.times[a], self.times[b]])


@dataclass
class ScalingResult:
    case: ScalingCase
    status: str
    note: str = ""
    rows: list[ScalingRow] = field(default_factory=list)
    results: dict[int, CaseResult] = field(default_factory=dict)
    reused: list[int] = field(default_factory=list)
    seconds: float = 0.0

    def row(self, name: str) -> ScalingRow | None:
        for row in self.rows:
            if row.name == name:
                return row
        return None

    @property
    def floor(self) -> ScalingRow | None:
        for row in self.rows:
            if row.role == "floor":
                return row
        return None

    def k_over_floor(self) -> float | None:
        """The exponent of treeclass's time *relative to the floor's* (see
        `relative_exponent`), or `None` without both rows."""
        row, floor = self.row("treeclass"), self.floor
        if row is None or floor is None:
            return None
        return relative_exponent(row.times, floor.times)


def relative_exponent(times: dict[int, float], floor: dict[int, float]) -> float | None:
    """The slope of log(time / floor time) against log(n), over the sizes both timed.

    0 means the implementation grows exactly as the floor (plain dicts under the same JAX
    call) does; 0.1 means its time relative to the floor grows as n^0.1. Where JAX's own
    cost grows faster than linearly (dispatching 20,000 arrays), the plain exponent `k`
    of every implementation shows that growth; this one shows what the tree library adds.
    `None` with fewer than two common sizes.
    """
    common = sorted(set(times) & set(floor))
    if len(common) < 2:
        return None
    return fit_exponent(common, [times[n] / floor[n] for n in common])


def _scaling_plan(plan: Plan) -> Plan:
    # the exponent needs the medians, not tight ratios: fewer rounds than the main cases
    # (and no warm-up call: the first, checked call has warmed every implementation up).
    # Seven in a full run: a 1,000-layer train step is one call per sample, and a median
    # of five such calls once put treeclass 32% above the floor where a re-run measured 5%
    rounds = min(plan.rounds, 7 if plan.rounds > 7 else 3)
    return dataclasses.replace(plan, rounds=rounds, warmup=0, remeasures=0)


def _untargeted(case: Case, name: str) -> Case:
    previous = case.plan

    def plan(base: Plan) -> Plan:
        return _scaling_plan(previous(base) if previous is not None else base)

    return dataclasses.replace(case, name=name, target=None, plan=plan)


def _from_main(
    name: str, title: str, main_at: Callable[[int], Case], sizes: tuple[int, ...], **options: Any
) -> ScalingCase:
    """`scaling_{name}`: the main case `main_at(n)` at each size, without its target and
    with the scaling rounds; a size whose main case ran in this run reuses that result
    (found by the main case's own name, so renaming it cannot silently stop the reuse)."""
    return ScalingCase(
        f"scaling_{name}",
        title,
        lambda n: _untargeted(main_at(n), f"scaling_{name}_{n}"),
        sizes,
        reuse=lambda n: main_at(n).name,
        **options,
    )


# -- the operations -------------------------------------------------------------------------


def _dispatch_at(n: int, sizes: Sizes) -> Case:
    def entries() -> list[Entry]:
        def make(kit: Kit) -> Callable[[], Any]:
            model = _model(kit, n, sizes.width)
            x, _ = _batch(sizes.batch, sizes.width)
            call = jax.jit(lambda model, x: x * 2, keep_unused=True)
            return lambda: call(model, x)

        return _per_kit(make, canon=_array_canon)

    return Case(
        name=f"scaling_dispatch_{n}",
        group="9. scaling",
        title=f"`jax.jit` dispatch with a {n}-layer MLP argument",
        entries=entries,
        sync=_block_array,
        plan=_scaling_plan,
    )


def _tagged_model(kit: Kit, n: int, width: int) -> Any:
    from .cases import _activations, _layer_arrays

    ws, bs = _layer_arrays(n, width)
    return kit.mlp([kit.tagged_linear(w, b, a) for w, b, a in zip(ws, bs, _activations(n))])


def _tree_mask_at(n: int, sizes: Sizes) -> Case:
    def entries() -> list[Entry]:
        def make(kit: Kit) -> Callable[[], Any]:
            model, mask = _tagged_model(kit, n, sizes.width), kit.tree_mask
            return lambda: mask(model)

        def by_hand() -> Callable[[], Any]:
            import treeclass as tc

            model = _tagged_model(get_kit("treeclass"), n, sizes.width)
            freeze, is_nondiff, tree_map = tc.freeze, tc.is_nondiff, jax.tree_util.tree_map
            return lambda: tree_map(lambda x: freeze(x) if is_nondiff(x) else x, model)

        built = _per_kit(make, ("treeclass", "pytreeclass", "sepes"))
        built.insert(1, hand_written("treeclass (tree_map + freeze)", by_hand))
        return built

    return Case(
        name=f"scaling_tree_mask_{n}",
        group="9. scaling",
        title=f"`tree_mask` (freeze what `jax.grad` cannot differentiate) of a {n}-layer "
        "MLP with a string leaf per layer",
        entries=entries,
        sync=None,
        needs=("freeze",),
        plan=_scaling_plan,
    )


def _repr_at(n: int, sizes: Sizes) -> Case:
    def entries() -> list[Entry]:
        def make(kit: Kit) -> Callable[[], Any]:
            model = _model(kit, n, sizes.width)
            return lambda: repr(model)

        return _per_kit(make, canon=_text_canon)

    return Case(
        name=f"scaling_repr_{n}",
        group="9. scaling",
        title=f"`repr` of a {n}-layer MLP",
        entries=entries,
        sync=None,
        plan=_scaling_plan,
    )


def _summary_at(n: int, sizes: Sizes) -> Case:
    def entries() -> list[Entry]:
        def make(kit: Kit) -> Callable[[], Any]:
            model, summary = _model(kit, n, sizes.width), kit.summary
            return lambda: summary(model)

        return _per_kit(make, ("treeclass", "pytreeclass", "sepes"), canon=_text_canon)

    return Case(
        name=f"scaling_tree_summary_{n}",
        group="9. scaling",
        title=f"`tree_summary` of a {n}-layer MLP",
        entries=entries,
        sync=None,
        plan=_scaling_plan,
    )


def _array_canon(result: Any) -> dict[tuple, Any]:
    import numpy as np

    return {(): np.asarray(result)}


def _text_canon(result: Any) -> dict[tuple, Any]:
    if not isinstance(result, str) or not result:
        raise TypeError(f"expected the text, got a {type(result).__name__}")
    return {}


def _block_array(result: Any) -> Any:
    return result.block_until_ready()


def scaling_cases(
    sizes: Sizes, mode: str, layer_counts: Sequence[int] | None = None
) -> list[ScalingCase]:
    """The scaling cases for `mode` (`"full"`, `"quick"` or `"smoke"`).

    **Arguments**

    - `sizes`: the main cases' sizes (width and batch come from there);
    - `mode`: picks the layer counts, the train step's largest size and the block counts
      of the stacked model's compile;
    - `layer_counts`: other layer counts (the train step still stops at its largest; the
      stacked compile keeps its block counts).
    """
    counts = tuple(sorted(layer_counts or SCALING_SIZES[mode]))
    train_counts = tuple(n for n in counts if n <= _TRAIN_STEP_LARGEST[mode]) or counts[:1]
    width = sizes.width

    return [
        _from_main(
            "flatten",
            "flatten + unflatten round trip",
            lambda n: flatten_layers_case(n, width),
            counts,
        ),
        ScalingCase(
            "scaling_dispatch",
            "`jax.jit` dispatch (trivial body, every leaf passed)",
            lambda n: _dispatch_at(n, sizes),
            counts,
            note="`jax.jit(lambda model, x: x * 2, keep_unused=True)`; equinox through `jax.jit`",
        ),
        _from_main(
            "train_step",
            "jitted SGD train step",
            lambda n: train_step_case(n, sizes),
            train_counts,
            note=f"up to {train_counts[-1]:,} layers: compiling the step takes minutes "
            "per implementation beyond",
        ),
        _from_main(
            "set_deep",
            "set one leaf deep (layer n/2's weight)",
            lambda n: set_deep_case(n, width),
            counts,
        ),
        _from_main(
            "apply_selector",
            '`.at[Linear]["weight"].apply` and equivalents',
            lambda n: apply_selector_case(n, width),
            counts,
        ),
        ScalingCase(
            "scaling_tree_mask",
            "`tc.tree_mask` and equivalents",
            lambda n: _tree_mask_at(n, sizes),
            counts,
        ),
        ScalingCase("scaling_repr", "`repr`", lambda n: _repr_at(n, sizes), counts),
        ScalingCase(
            "scaling_tree_summary",
            "`tc.tree_summary` and equivalents",
            lambda n: _summary_at(n, sizes),
            counts,
        ),
        _from_main(
            "stacked_compile",
            "compile the train step of N stacked (or unrolled) blocks",
            # the target case's eight rounds steady its verdict; an exponent needs medians
            lambda n: dataclasses.replace(
                compile_case(StackSize.of(sizes, n)), plan=one_call_per_sample
            ),
            STACKED_BLOCKS[mode],
            note="the stacked model should compile in a time flat in N",
            # one compile takes a second or more: the mode's budget would leave the
            # unrolled model out of the largest size, the one the case is about
            budget_s=300.0,
            unit="blocks",
        ),
    ]


# -- running --------------------------------------------------------------------------------

_STATUS_WORDS = {
    "skipped": "skipped",
    "unavailable": "not available",
    "failed": "failed",
    "wrong": "gave different numbers",
}


def run_scaling(
    case: ScalingCase,
    plan: Plan,
    rng: random.Random,
    budget_s: float = math.inf,
    earlier: dict[str, CaseResult] | None = None,
) -> ScalingResult:
    """Time `case` at each of its sizes, smallest first.

    **Arguments**

    - `case`: the scaling case;
    - `plan`: the run's timing plan (each size's case trims it to a few rounds);
    - `rng`: the source of the shuffled orders;
    - `budget_s`: the most seconds an implementation may be projected to take at the
      next size before it is left out of the larger sizes;
    - `earlier`: results of main cases of this run, by name, to reuse (see `reuse`).

    **Returns**

    A `ScalingResult` with one `ScalingRow` per implementation.
    """
    start = time.perf_counter()
    result = ScalingResult(case, "ran")
    rows: dict[str, ScalingRow] = {}
    left_out: set[str] = set()
    for index, n in enumerate(case.sizes):
        reuse = earlier.get(case.reuse(n)) if earlier and case.reuse else None
        if reuse is not None and reuse.status == "ran":
            at_n = reuse
            result.reused.append(n)
        else:
            at_n = run_case(_without(case.case_at(n), left_out), plan, rng)
        result.results[n] = at_n
        if at_n.status == "skipped":
            if not rows:
                result.status, result.note = "skipped", at_n.note
                break
            for row in rows.values():
                row.notes.append(f"n={n:,}: case skipped ({at_n.note})")
            continue
        for entry in at_n.entries:
            row = rows.setdefault(entry.name, ScalingRow(entry.name, entry.role))
            if entry.status == "ok" and entry.series is not None:
                row.times[n] = entry.series.median
            elif entry.name not in left_out:
                row.notes.append(
                    f"n={n:,}: {_STATUS_WORDS.get(entry.status, entry.status)}"
                    + (f" ({entry.note})" if entry.note else "")
                )
        if index + 1 < len(case.sizes):
            budget = max(budget_s, case.budget_s)
            _leave_out_slow(rows, left_out, n, case.sizes[index + 1], plan, budget)
    result.rows = list(rows.values())
    result.seconds = time.perf_counter() - start
    return result


def _without(case: Case, names: set[str]) -> Case:
    if not names:
        return case
    entries = case.entries
    return dataclasses.replace(case, entries=lambda: [e for e in entries() if e.name not in names])


def _leave_out_slow(
    rows: dict[str, ScalingRow],
    left_out: set[str],
    n: int,
    next_n: int,
    plan: Plan,
    budget_s: float,
) -> None:
    rounds = _scaling_plan(plan).rounds
    for row in rows.values():
        if row.name in left_out or n not in row.times:
            continue
        growth = max(1.0, row.k_last or 1.0)
        projected = row.times[n] * (next_n / n) ** growth
        # the first (checked) call, a calibration call and the rounds
        if projected * (rounds + 2) > budget_s:
            left_out.add(row.name)
            row.notes.append(
                f"not timed from n={next_n:,}: projected {projected:.3g} s per "
                f"call (k={growth:.2f} so far)"
            )


def flagged(result: ScalingResult) -> list[ScalingRow]:
    """The rows whose fitted exponent exceeds `LINEAR_LIMIT`."""
    return [row for row in result.rows if above_linear(row.k)]


def run_scaling_cases(
    cases: Sequence[ScalingCase],
    plan: Plan,
    seed: int,
    budget_s: float,
    earlier: dict[str, CaseResult],
    progress: TextIO | None = None,
) -> list[ScalingResult]:
    """Run every scaling case, one progress line each (see `run_scaling`)."""
    rng = random.Random(seed + 1)
    results = []
    width = len(str(len(cases)))
    for index, case in enumerate(cases, 1):
        if progress is not None:
            progress.write(
                f"[scaling {index:>{width}}/{len(cases)}] {case.name} "
                f"(n = {', '.join(f'{n:,}' for n in case.sizes)}) ... "
            )
            progress.flush()
        result = run_scaling(case, plan, rng, budget_s, earlier)
        results.append(result)
        if progress is not None:
            progress.write(_progress_line(result) + "\n")
            progress.flush()
    return results


def _progress_line(result: ScalingResult) -> str:
    if result.status == "skipped":
        return f"skipped: {result.note}"
    parts = []
    for row in result.rows:
        if row.k is not None:
            parts.append(f"{row.name} k={row.k:.2f}")
    tc, floor = result.row("treeclass"), result.floor
    warn = ""
    if tc is not None and above_linear(tc.k):
        beside = f"; the floor's is {floor.k:.2f}" if floor is not None and floor.k else ""
        relative = result.k_over_floor()
        if relative is not None:
            beside += f"; relative to the floor {relative:+.2f}"
        warn = f" <- treeclass above k={LINEAR_LIMIT:g}{beside}"
    return f"{'; '.join(parts)}{warn} ({result.seconds:.1f} s)"
