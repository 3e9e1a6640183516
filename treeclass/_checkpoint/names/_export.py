"""Export: a tree's data under another library's names, through the key rules that load it.
A plan first binds the template's tensors to the file's names, refusing what cannot be
bound both ways before any is computed (the checkpoints guide, "The plan"); then each
tensor is computed (a transform that only moves elements is inverted from a run on
labels of its elements)."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..._values import is_prng_key, path_str
from ._catalog import describe
from ._rules import (
    Rule,
    Run,
    bind,
    layer_rules,
    outputs,
    pattern_choices,
    reads_layers,
    run_on,
    source_hit,
    target_hits,
)
from ._stacks import stacks_of
from ._walk import NO_DATA, NUMBER, TENSOR, entries, is_abstract


class Target(NamedTuple):
    """A model array an export reads: its name, key path (for messages) and value (one
    layer of it, `slot`, for a stack read by layers)."""

    name: str
    where: str
    value: Any
    slot: int | None
    shape: tuple
    dtype: Any
    # the rules that cannot give it: those reading its stack by layers, for a stack whole
    skip: frozenset[int] = frozenset()

    def get(self) -> Any:
        return self.value if self.slot is None else self.value[self.slot]


class Plan:
    """The tensors of `tree` bound to the file's names: rules' runs (their targets bound),
    and arrays no rule takes."""

    def __init__(self, tree: Any, rules: Sequence[Rule], action: str) -> None:
        self.action = action
        targets = _targets(tree, rules, action)
        self.groups, self.own = bind(rules, targets, lambda t: self._bound(rules, t))
        for (number, values), group in self.groups.items():
            rule = group.rule
            if len(group.bound) < len(rule.targets):
                have = [group.bound[k].where for k in sorted(group.bound)]
                lack = [n for k, n in enumerate(group.names("targets")) if k not in group.bound]
                raise ValueError(
                    f"{action}: key rule {rule.text()} writes {group.names('sources')} from all "
                    f"its targets; the model has {have} but not {lack}"
                )
            for position, source in enumerate(group.names("sources")):
                self._reads_back(rules, source, (number, position, values), rule.text())
        for target in self.own:
            self._reads_back(rules, target.name, None, f"{target.where} (under its own name)")

    def _bound(self, rules: Sequence[Rule], target: Target) -> tuple | None:
        """(rule number, target position, captured values) of the run giving `target`."""
        hits = [hit for hit in target_hits(rules, target.name) if hit[0] not in target.skip]
        if not hits:
            return None
        if len({number for number, _, _ in hits}) > 1:
            shown = " and ".join(rules[number].text() for number, _, _ in hits[:2])
            raise ValueError(
                f"{self.action}: {target.where} (named {target.name!r}) is a target of key "
                f"rules {shown}, so export cannot tell which source to write it to. "
                "Tell the rules apart, by the values a capture takes where they differ "
                "(`'layers.{i}.self_attn.{n:q|k|v|o}_proj.weight'`)"
            )
        number, position, match = hits[0]
        rule = rules[number]
        values = match.groupdict()
        # a capture the target does not use is known if its source allows one value
        values.update({c: v[0] for c, v in pattern_choices(rule.sources).items() if len(v) == 1})
        lacking = [c for c in rule.captures if c not in values]
        if lacking:
            raise ValueError(
                f"{self.action}: key rule {rule.text()} cannot be run backwards: its target "
                f"{rule.targets[position]!r} does not capture {lacking}, which its sources use"
            )
        return number, position, tuple(values[c] for c in rule.captures)

    def _reads_back(self, rules: Sequence[Rule], name: str, expected: Any, what: str) -> None:
        """Refuse a name of the file that load would not read as the plan wrote it."""
        hit = source_hit(rules, name)
        if hit == expected:
            return
        if hit is None:  # (a capture limited on the source side only)
            reader = "no key rule, so under its own name"
        else:
            reader = f"key rule {rules[hit[0]].text()}"
            if expected is not None and hit[0] == expected[0]:
                reader += f" with other captures ({dict(zip(rules[hit[0]].captures, hit[2]))})"
        raise ValueError(
            f"{self.action}: {what} writes {name!r}, which load reads through {reader}: the table "
            "would not read back what it writes. Make the rules tell the names apart (limit a "
            "capture, `{n:q|k|v}`, or order the rules so the narrower comes first)"
        )


def _targets(tree: Any, rules: Sequence[Rule], action: str) -> list[Target]:
    """The tree's data by name; a stacked leaf by its layers unless the rules take it whole."""
    stacks = stacks_of(tree)
    out = []
    for entry in entries(tree, action, f"{action}(path, value, rules=rules)"):
        if not entry.is_data:
            continue  # strings, functions, static fields: no foreign layout holds them
        where = path_str(tree, entry.path)
        value: Any = entry.value  # (a number's becomes an array below)
        if is_abstract(value):
            raise ValueError(NO_DATA.format(where=where, value=describe(value)))
        if entry.category == NUMBER:
            value = np.asarray(value)
        stack = next((s for s in stacks if s.per_layer(entry.name)), None)
        by_layers = (
            entry.category == TENSOR
            and stack is not None
            and (reads_layers(rules, stack, entry.name) or not target_hits(rules, entry.name))
        )
        names = (stack.per_layer(entry.name) or []) if by_layers and stack else [entry.name]
        if is_prng_key(value) and not any(target_hits(rules, name) for name in names):
            raise ValueError(
                f"{where} is a PRNG key array, which other libraries' layouts have no dtype "
                "for: export its key data with a rule carrying both directions, (name, "
                f"{entry.name!r}, jax.random.wrap_key_data, jax.random.key_data)"
            )
        if not by_layers:
            skip = frozenset(layer_rules(rules, stack, entry.name) if stack else ())
            out.append(
                Target(entry.name, where, value, None, tuple(value.shape), value.dtype, skip)
            )
            continue
        for slot, name in enumerate(names):
            where_slot, shape = f"{where}[{slot}]", tuple(value.shape[1:])
            out.append(Target(name, where_slot, value, slot, shape, value.dtype))
    return out


class ForeignTensor(NamedTuple):
    """One tensor of an export: its name, dtype and shape, and how to compute it."""

    name: str
    dtype: np.dtype
    shape: tuple
    compute: Callable[[], np.ndarray]


class _Gather(NamedTuple):
    """Where each source element lies among the targets' elements, flattened and joined."""

    shapes: tuple[tuple[int, ...], ...]  # of the sources
    positions: tuple[np.ndarray, ...]  # per source, positions among the targets' elements
    again: np.ndarray  # positions holding an element given before ...
    first: np.ndarray  # ... at these positions


class _Chain(NamedTuple):
    """A chain of transposes and reshapes, inverted step by step (no labels: fast)."""

    shapes: tuple[tuple[int, ...], ...]  # of the one source
    # ("transpose", inverse order) / ("reshape", shape)
    steps: tuple[tuple[str, tuple[int, ...]], ...]

    def apply(self, target: np.ndarray) -> np.ndarray:
        for kind, arg in self.steps:
            target = target.transpose(arg) if kind == "transpose" else target.reshape(arg)
        return target


_RESHAPES = ("reshape", "squeeze", "expand_dims")


def _chain(rule: Rule, shape: tuple) -> _Chain | None:
    """The inverse of a one-to-one transform of transposes and reshapes alone, or None."""
    assert rule.transform is not None
    if len(rule.sources) != 1 or len(rule.targets) != 1:
        return None
    try:  # traced on integers: a dtype change (`astype`) shows as an operation
        closed = jax.make_jaxpr(rule.transform)(jax.ShapeDtypeStruct(shape, np.int32))
    except Exception:
        return None
    jaxpr = closed.jaxpr
    if jaxpr.constvars or len(jaxpr.invars) != 1 or len(jaxpr.outvars) != 1:
        return None
    at, steps = jaxpr.invars[0], []
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if len(eqn.invars) != 1 or eqn.invars[0] is not at or name not in ("transpose", *_RESHAPES):
            return None
        before = tuple(eqn.invars[0].aval.shape)
        if name == "transpose":
            steps.append(
                ("transpose", tuple(int(k) for k in np.argsort(eqn.params["permutation"])))
            )
        else:
            steps.append(("reshape", before))
        at = eqn.outvars[0]
    if jaxpr.outvars[0] is not at:
        return None
    return _Chain((tuple(shape),), tuple(reversed(steps)))


def _suggested(count: int, shapes: Sequence[tuple]) -> list[tuple[tuple, ...]]:
    """Source shapes the target shapes suggest for a rule with `count` sources."""
    out: list[tuple[tuple, ...]] = []

    def add(*candidate: tuple, flipped: bool = False) -> None:
        """Suggest `candidate` (and, if `flipped`, it with each shape reversed next)."""
        for shapes in (candidate, tuple(s[::-1] for s in candidate))[: 1 + flipped]:
            if shapes not in out:
                out.append(shapes)

    if count == len(shapes):  # one to one: as they are, or reversed (transposed)
        add(*shapes, flipped=True)
        add(*(s[:-2] + s[-2:][::-1] for s in shapes))
    if count == 1 and len(shapes) == 1:
        t = shapes[0]
        orders = (
            itertools.permutations(t) if len(t) <= 4 else (t[k:] + t[:k] for k in range(len(t)))
        )
        for order in orders:  # axes moved: any order of them (few axes)
            add(tuple(order))
        for a in range(len(t)):  # a reshape that split axes: them merged
            for b in range(a + 2, len(t) + 1):
                merged = t[:a] + (math.prod(t[a:b]),) + t[b:]
                add(merged, flipped=True)
    if count == 1 and len(shapes) > 1:  # a split: the targets joined along an axis
        rank = len(shapes[0])
        if all(len(s) == rank for s in shapes):
            for a in range(rank):
                if all(s[:a] + s[a + 1 :] == shapes[0][:a] + shapes[0][a + 1 :] for s in shapes):
                    joined = shapes[0][:a] + (sum(s[a] for s in shapes),) + shapes[0][a + 1 :]
                    add(joined, flipped=True)
            if all(s == shapes[0] for s in shapes):  # or stacked along a new axis
                add((len(shapes), *shapes[0]))
        for s in shapes:  # or copied into each (tied weights, `lambda w: (w, w.T)`)
            add(s, flipped=True)
    if count > 1 and len(shapes) == 1:  # a concatenation: the target cut in equal parts
        t = shapes[0]
        for a in range(len(t)):
            if t[a] % count == 0:
                part = t[:a] + (t[a] // count,) + t[a + 1 :]
                add(*[part] * count, flipped=True)
        if t and t[0] == count:
            add(*[t[1:]] * count)
    return out


class Exporter:
    def __init__(self, plan: Plan) -> None:
        self.action = plan.action
        self._gathers: dict[tuple, _Gather | _Chain] = {}
        # what each name of the export is computed from: (group or own target, position)
        self.sources: dict[str, tuple[Any, int]] = {}
        self.layout: dict[str, tuple[np.dtype, tuple]] = {}
        # (one origin per name: the plan refuses a name load would not read back as written)
        for group in plan.groups.values():
            layouts = self._layouts(group)
            for position, (source, layout) in enumerate(zip(group.names("sources"), layouts)):
                self.layout[source], self.sources[source] = layout, (group, position)
        for target in plan.own:
            self.layout[target.name] = (np.dtype(target.dtype), target.shape)
            self.sources[target.name] = (target, 0)
        self._cached: tuple[Any, list[np.ndarray]] | None = None

    def _layouts(self, group: Run) -> list[tuple[np.dtype, tuple]]:
        rule = group.rule
        targets = [group.bound[k] for k in range(len(rule.targets))]
        keys = [t.where for t in targets if jnp.issubdtype(t.dtype, jax.dtypes.prng_key)]
        if keys and rule.inverse is None:
            raise ValueError(
                f"{self.action}: key rule {rule.text()} gives the PRNG key array {keys[0]}, which "
                "other libraries' layouts have no dtype for: give the rule both directions, "
                "(source, target, jax.random.wrap_key_data, jax.random.key_data)"
            )
        if rule.transform is None:
            return [(np.dtype(targets[0].dtype), targets[0].shape)]
        structs = [jax.ShapeDtypeStruct(t.shape, t.dtype) for t in targets]
        if rule.inverse is not None:
            results = outputs(self._what(rule), rule, jax.eval_shape, structs, "sources")
            return [(np.dtype(r.dtype), tuple(r.shape)) for r in results]
        gather = self._gather(rule, structs)
        dtype = np.dtype(targets[0].dtype)
        return [(dtype, shape) for shape in gather.shapes]

    def _what(self, rule: Rule) -> str:
        return f"{self.action}: the inverse of key rule {rule.text()}"

    def _gather(self, rule: Rule, structs: list[Any]) -> _Gather | _Chain:
        key = (rule, tuple((s.shape, str(s.dtype)) for s in structs))
        if key in self._gathers:
            return self._gathers[key]
        dtypes = {np.dtype(s.dtype) for s in structs}
        fits: dict[tuple, _Gather | _Chain] = {}
        if len(dtypes) == 1:
            dtype = dtypes.pop()
            for shapes in _suggested(len(rule.sources), [tuple(s.shape) for s in structs]):
                if self._gives(rule, shapes, dtype, structs):
                    chain = _chain(rule, shapes[0]) if len(shapes) == 1 else None
                    found = chain or _probe(rule, shapes, [tuple(s.shape) for s in structs])
                    if found is not None:
                        fits.setdefault(tuple(shapes), found)
        if len(fits) != 1:
            shown = " or ".join(
                "(" + ", ".join(f"[{','.join(map(str, s))}]" for s in shapes) + ")"
                for shapes in fits
            )
            reason = (
                f"it moves elements for several source shapes ({shown}), and the model "
                "cannot say which the checkpoint had"
                if fits
                else "it does more than move elements (arithmetic, a dtype change), or "
                "reads sources of shapes the targets do not suggest"
            )
            raise ValueError(
                f"{self.action}: the transform of key rule {rule.text()} cannot be "
                f"inverted: {reason}. Give the rule its inverse as a fourth element, "
                "(source, target, transform, inverse), taking the targets' arrays and "
                "returning the sources' (one array, or a tuple in the sources' order)"
            )
        self._gathers[key] = gather = next(iter(fits.values()))
        return gather

    @staticmethod
    def _gives(rule: Rule, shapes: Sequence[tuple], dtype: np.dtype, structs: list[Any]) -> bool:
        try:
            sources = [jax.ShapeDtypeStruct(s, dtype) for s in shapes]
            results = outputs("", rule, jax.eval_shape, sources)
        except ValueError:
            return False
        return _layouts_of(results) == _layouts_of(structs)

    def tensors(self) -> list[ForeignTensor]:
        """The export's tensors, in natural order of their names (layer 2 before 10)."""
        return [
            ForeignTensor(name, *self.layout[name], functools.partial(self.compute, name))
            for name in sorted(self.sources, key=_natural)
        ]

    def compute(self, name: str) -> np.ndarray:
        origin, position = self.sources[name]
        if isinstance(origin, Target):
            return np.asarray(origin.get())
        if self._cached is None or self._cached[0] is not origin:
            self._cached = None  # one group's sources on the host at a time
            self._cached = (origin, self._run(origin))
        return self._cached[1][position]

    def _run(self, group: Run) -> list[np.ndarray]:
        rule = group.rule
        values = [group.bound[k].get() for k in range(len(rule.targets))]
        # on the host; a key array as it is (its inverse, `jax.random.key_data`, makes data)
        arrays = [v if is_prng_key(v) else np.asarray(v) for v in values]
        if rule.transform is None:
            return arrays
        if rule.inverse is not None:
            layouts = [self.layout[name] for name in group.names("sources")]
            checked = [jax.ShapeDtypeStruct(shape, dtype) for dtype, shape in layouts]
            found = outputs(self._what(rule), rule, run_on, arrays, "sources", checked=checked)
            return [np.asarray(r) for r in found]
        structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]
        gather = self._gather(rule, structs)
        if isinstance(gather, _Chain):
            return [gather.apply(arrays[0])]
        joined = np.concatenate([a.reshape(-1) for a in arrays])
        if gather.again.size:
            given, before = joined[gather.again], joined[gather.first]
            if given.tobytes() != before.tobytes():
                wheres = [group.bound[k].where for k in range(len(rule.targets))]
                raise ValueError(
                    f"{self.action}: key rule {rule.text()} reads one tensor for "
                    f"{wheres}, which hold different values where they should be copies "
                    "of each other (tied weights are written once)"
                )
        return [
            joined[index].reshape(shape) for index, shape in zip(gather.positions, gather.shapes)
        ]


def _probe(rule: Rule, shapes: Sequence[tuple], targets: Sequence[tuple]) -> _Gather | None:
    """Where the transform puts each source element, learned on labels; None if not a move."""
    sizes = [math.prod(s) for s in shapes]
    total = sum(sizes)
    label = np.dtype(np.int32 if 2 * total < 2**31 else np.int64)
    offset = total // 2  # labels of both signs: `abs` or `maximum(w, 0)` are not moves

    def run(labels: np.ndarray) -> np.ndarray | None:
        parts, at = [], 0
        for shape, size in zip(shapes, sizes):
            parts.append(labels[at : at + size].reshape(shape))
            at += size
        try:
            results = outputs("", rule, run_on, parts)
        except ValueError:
            return None
        outs = [np.asarray(r) for r in results]
        if [o.shape for o in outs] != [tuple(t) for t in targets]:
            return None
        if not all(np.issubdtype(o.dtype, np.integer) for o in outs):
            return None
        return np.concatenate([o.reshape(-1) for o in outs]).astype(np.int64) + offset

    where = run(np.arange(total, dtype=label) - offset)
    if where is None or (where.size and (where.min() < 0 or where.max() >= total)):
        return None
    counts = np.bincount(where, minlength=total)
    if (counts == 0).any():  # some source element is in no target
        return None
    shuffled = np.random.default_rng(0).permutation(total)
    again_where = run(shuffled.astype(label) - offset)
    if again_where is None or not np.array_equal(again_where, shuffled[where]):
        return None  # it depends on the values (a sort, a comparison), not only positions
    if (counts == 1).all():
        first = np.empty(total, np.int64)
        first[where] = np.arange(where.size)
        again = np.zeros(0, np.int64)
        before = again
    else:
        order = np.argsort(where, kind="stable")
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        first = order[starts]
        mask = np.ones(where.size, bool)
        mask[first] = False
        again = np.nonzero(mask)[0]
        before = first[where[again]]
    index, at = [], 0
    for size in sizes:
        index.append(first[at : at + size])
        at += size
    return _Gather(tuple(tuple(s) for s in shapes), tuple(index), again, before)


def _layouts_of(arrays: Sequence[Any]) -> list[tuple[tuple, np.dtype]]:
    return [(tuple(a.shape), np.dtype(a.dtype)) for a in arrays]


def _natural(name: str) -> list[tuple[int, Any]]:
    return [(0, int(p)) if p.isdigit() else (1, p) for p in name.split(".")]


def export(tree: Any, rules: Sequence[Rule], action: str) -> list[ForeignTensor]:
    """The tensors of `tree` in the layout `rules` load from, checked before any is computed."""
    return Exporter(Plan(tree, rules, action)).tensors()
