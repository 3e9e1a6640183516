"""Key rules: a checkpoint's names mapped to a model's key paths, with transforms (the
language: the checkpoints guide); `RuledCatalog` applies a rule table to any catalog."""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from ..._glob import CAPTURE, Glob, parse
from ..._values import array_type
from ..files._source import dtype_name, numpy_dtype
from ._catalog import Catalog, Stored, Wrapping
from ._fixes import listed
from ._restore import release_host_copy
from ._stacks import StackAt
from ._walk import TENSOR


def pattern_choices(patterns: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """The captures of `patterns` limited to some values (`{n:q|k|v}`), with them."""
    return {c.name: c.values for p in patterns for c in parse(p).captures if c.values}


class Rule(NamedTuple):
    """One compiled rule: source and target patterns, their captures, the transform."""

    sources: tuple[str, ...]
    targets: tuple[str, ...]
    transform: Callable[..., Any] | None
    regexes: tuple[re.Pattern[str], ...]
    captures: tuple[str, ...]
    inverse: Callable[..., Any] | None = None  # for export: targets -> sources
    # the targets as regexes (captures limited to the values their sources allow)
    target_regexes: tuple[re.Pattern[str], ...] = ()

    def text(self) -> str:
        show = lambda names: names[0] if len(names) == 1 else list(names)  # noqa: E731
        return f"{show(self.sources)!r} -> {show(self.targets)!r}"


_BAD_RULE = (
    "A key rule is a (source, target), (source, target, transform) or (source, target, "
    "transform, inverse) tuple, or a dict {{source: target}}; got {rule!r}. Sources are "
    "the checkpoint's names with captures (`'layers.{{i}}.weight'`), targets the model's "
    "key paths (`'blocks[{{i}}].w'`)."
)
_BAD_TABLE = (
    "rules= takes a dict {{source: target}} or a list of (source, target) / (source, "
    "target, transform) / (source, target, transform, inverse) tuples, in the order they "
    "are tried; got {what}"
)


def compile_rules(rules: Any) -> tuple[Rule, ...]:
    """Check a rule table and compile its patterns; `ValueError`/`TypeError` naming a bad rule."""
    if isinstance(rules, Mapping):
        rules = list(rules.items())
    elif not isinstance(rules, (list, tuple)):  # a set has no order; a string is no table
        raise TypeError(_BAD_TABLE.format(what=f"a {type(rules).__name__} {rules!r:.60}"))
    compiled = []
    for rule in rules:
        if not isinstance(rule, tuple) or len(rule) not in (2, 3, 4):
            raise TypeError(_BAD_RULE.format(rule=rule))
        source, target, transform, inverse = (*rule, None, None)[:4]
        if len(rule) == 4 and (transform is None or not callable(inverse)):
            raise TypeError(
                f"Key rule {rule!r}: a fourth element is the transform's inverse (the "
                "model's arrays -> the checkpoint's, for export), so the rule has a "
                "transform and the inverse is callable"
            )
        sides: list[Any] = [(p,) if isinstance(p, str) else p for p in (source, target)]
        if not all(
            isinstance(side, (list, tuple)) and side and all(isinstance(p, str) and p for p in side)
            for side in sides
        ):
            raise TypeError(_BAD_RULE.format(rule=rule))
        sources, targets = tuple(sides[0]), tuple(sides[1])
        if transform is not None and not callable(transform):
            raise TypeError(f"The transform of key rule {rule!r} is not callable")
        if transform is None and (len(sources) > 1 or len(targets) > 1):
            raise ValueError(
                f"Key rule {rule!r} maps {len(sources)} names to {len(targets)}: it needs a "
                "transform (concatenate the sources, or split into the targets)"
            )
        parsed = [_parsed(p, rule) for p in sources + targets]
        reads, writes = parsed[: len(sources)], parsed[len(sources) :]
        sources = tuple(p.dotted() for p in reads)
        targets = tuple(p.dotted() for p in writes)
        for side, names in (("sources", sources), ("targets", targets)):
            twice = next((n for k, n in enumerate(names) if n in names[:k]), None)
            if twice is not None:
                raise ValueError(
                    f"Key rule {rule!r} names {twice!r} twice among its {side}: each "
                    f"{side[:-1]} is one tensor{' read' if side == 'sources' else ''}, "
                    "in the order the transform "
                    + ("takes them" if side == "sources" else "returns them")
                )
        captures = [tuple(dict.fromkeys(c.name for c in p.captures)) for p in parsed]
        captured = set(captures[0])
        if any(set(other) != captured for other in captures[1 : len(sources)]):
            raise ValueError(f"The sources of key rule {rule!r} capture different names")
        for target, used in zip(targets, captures[len(sources) :]):
            if not set(used) <= captured:
                raise ValueError(
                    f"Key rule {rule!r}: the target {target!r} uses "
                    f"{sorted(set(used) - captured)}, which no source captures"
                )
        many = frozenset(c.name for p in reads for c in p.captures if c.many)
        backward = tuple(p.regex(pattern_choices(sources), many) for p in writes)
        regexes = tuple(p.regex() for p in reads)
        compiled.append(Rule(sources, targets, transform, regexes, captures[0], inverse, backward))
    return tuple(compiled)


def _parsed(pattern: str, rule: Any) -> Glob:
    try:
        parsed = parse(pattern)
    except ValueError as error:
        raise ValueError(f"Key rule {rule!r}: {error}") from None
    wild = next((s for s in parsed.segments if s.is_wild()), None)
    if wild is not None:
        raise ValueError(
            f"Key rule {rule!r}: {pattern!r} has the wildcard segment {wild!r}, but a rule "
            "writes back every segment it reads: match a varying segment with a capture, "
            "'{name}' for one, '{name*}' for one or more"
        )
    return parsed


def in_file_dtypes(names: Iterable[str]) -> contextlib.AbstractContextManager[Any]:
    """Where a transform of tensors with these dtype names runs, checked and run alike:
    with 64-bit types on for a 64-bit tensor (tracing would make it 32-bit), else as is."""
    found = [d for d in map(numpy_dtype, names) if d is not None]
    if any(jax.dtypes.canonicalize_dtype(d) != d for d in found):
        return jax.enable_x64(True)
    return contextlib.nullcontext()


def source_hit(rules: Sequence[Rule], name: str) -> tuple[int, int, tuple[str, ...]] | None:
    """The first rule reading the file's `name`: (number, which source, captured values)."""
    for number, rule in enumerate(rules):
        for which, regex in enumerate(rule.regexes):
            match = regex.fullmatch(name)
            if match is not None:
                return number, which, tuple(match.group(c) for c in rule.captures)
    return None


def target_hits(rules: Sequence[Rule], name: str) -> list[tuple[int, int, re.Match[str]]]:
    """Every (rule number, target position, match) giving the model's `name`, in order."""
    return [
        (number, position, match)
        for number, rule in enumerate(rules)
        for position, regex in enumerate(rule.target_regexes)
        if (match := regex.fullmatch(name)) is not None
    ]


def layer_rules(rules: Sequence[Rule], stack: StackAt, name: str) -> set[int]:
    """The numbers of the rules giving a layer of the stacked leaf `name` (never it whole)."""
    return {n for layer in stack.per_layer(name) or [] for n, _, _ in target_hits(rules, layer)}


def reads_layers(rules: Sequence[Rule], stack: StackAt, name: str) -> bool:
    """Whether some rule gives a layer of `name`, and none earlier names it whole."""
    by_layers = layer_rules(rules, stack, name)
    whole = [n for n, _, _ in target_hits(rules, name) if n not in by_layers]
    return bool(by_layers) and (not whole or min(by_layers) < min(whole))


def fill(pattern: str, values: Mapping[str, str]) -> str:
    return CAPTURE.sub(lambda m: values[m.group(1)], pattern)


class Run(NamedTuple):
    """One run of a rule: its captures, and what is bound to its positions on one side."""

    rule: Rule
    captures: dict[str, str]
    bound: dict[int, Any]  # by position among the rule's sources (load) or targets (export)

    def names(self, side: str) -> list[str]:
        """The rule's `"sources"` or `"targets"` with this run's captures filled in."""
        return [fill(pattern, self.captures) for pattern in getattr(self.rule, side)]


def bind(
    rules: Sequence[Rule], items: Iterable[Any], hit: Callable[[Any], Any]
) -> tuple[dict[tuple[int, tuple[str, ...]], Run], list[Any]]:
    """`items` bound to the runs of `rules`, `hit(item)` giving (rule number, position,
    captured values), or None for an item of no run: the runs by (number, values), in
    order of their first item, and the items of no run."""
    runs: dict[tuple[int, tuple[str, ...]], Run] = {}
    unbound = []
    for item in items:
        found = hit(item)
        if found is None:
            unbound.append(item)
            continue
        number, position, values = found
        if (number, values) not in runs:
            runs[number, values] = Run(rules[number], dict(zip(rules[number].captures, values)), {})
        runs[number, values].bound[position] = item
    return runs, unbound


class _Mapped(NamedTuple):
    rule: Rule | None  # None: a name no rule matched, under its own name
    sources: tuple[str, ...]  # the catalog's names read for it, in the rule's order
    position: int  # which of the rule's results
    names: tuple[str, ...] = ()  # the names of all the rule's results (its targets, filled)


class _Layers(NamedTuple):
    stack: StackAt
    slots: dict[int, str]  # slot -> the per-layer name that fills it


class RuledCatalog(Wrapping):
    """A catalog whose names are mapped by key rules, per-layer names filling stacked leaves."""

    def __init__(
        self, inner: Catalog, rules: Sequence[Rule], stacks: Sequence[StackAt] = ()
    ) -> None:
        super().__init__(inner)
        self.rules = rules
        self.stacks = tuple(stacks)
        self.mapped: dict[str, _Mapped] = {}
        runs, own = bind(rules, inner.names(), lambda name: source_hit(rules, name))
        for name in own:
            self._add(name, _Mapped(None, (name,), 0, (name,)))
        self._refuse_shadowed({n: key[0] for key, run in runs.items() for n in run.bound.values()})
        # names whose absence a problem line explains (a layout, a stack lacking layers)
        self.explained: set[str] = set()
        for run in runs.values():
            found, rule = run.bound, run.rule
            if len(found) < len(rule.sources):  # a concatenation lacks a part
                lacking = [n for k, n in enumerate(run.names("sources")) if k not in found]
                self.problems.append(
                    f"incomplete  key rule {rule.text()} found {sorted(found.values())} in "
                    f"{self.label} but not {lacking}"
                )
                continue
            sources = tuple(found[k] for k in range(len(rule.sources)))
            names = tuple(run.names("targets"))
            for position, name in enumerate(names):
                self._add(name, _Mapped(rule, sources, position, names))
        # per-layer names of the template's stacks: set aside, their stacked leaves offered
        self.layers: dict[str, _Mapped] = {}
        self.stacked: dict[str, _Layers] = {}
        self._slot_of: dict[str, tuple[str, int]] = {}
        self._beyond: dict[StackAt, set[int]] = {}  # layers a stack does not have
        for name in list(self.mapped):
            for stack in self.stacks:
                in_stack = stack.stacked(name)
                if in_stack is None:
                    layer = stack.layer_of(name)
                    if layer is not None and layer[0] >= stack.layers:  # a layer it lacks
                        self._beyond.setdefault(stack, set()).add(layer[0])
                        break
                    continue
                stacked_name, layer_slot = in_stack
                self.layers[name] = self.mapped.pop(name)
                self.stacked.setdefault(stacked_name, _Layers(stack, {})).slots[layer_slot] = name
                self._slot_of[name] = in_stack
                break
        for name, mapped in list(self.mapped.items()):
            whole = next((s for s in self.stacks if s.slots(name) is not None), None)
            if mapped.rule is None or whole is None:
                continue
            named = whole.per_layer(name)
            if named and any(rules[n] is mapped.rule for n in layer_rules(rules, whole, name)):
                # what export would write by layers, load does not read as one tensor
                del self.mapped[name]
                self.problems.append(
                    f"layout      key rule {mapped.rule.text()} reads {list(mapped.sources)} "
                    f"in {self.label} as the whole stack {name!r}, but the rule names that "
                    f"stack's layers ({named[0]!r}, ...): a capture stands "
                    "where the layer index belongs. The file holds the stack under one "
                    "name; name each layer in it, or add a rule for the whole stack before"
                )
                self.explained.add(name)
        for stacked_name, layers in self.stacked.items():
            if stacked_name in self.mapped:
                raise ValueError(
                    f"{self.title}: key rules map both {list(self.mapped[stacked_name].sources)} "
                    f"in {self.label} to the stacked {stacked_name!r} and per-layer names to its "
                    f"layers ({', '.join(map(repr, list(layers.slots.values())[:3]))}); keep one "
                    "of them"
                )
        # a transform's results by its inputs' shapes and dtypes: the 24 blocks of a model
        # are traced once, not 24 times
        self._abstract: dict[tuple[Rule, tuple[tuple, ...]], list[Any]] = {}
        self._lacking: dict[str, tuple[StackAt, int, tuple[int, ...]]] = {}
        self._stored_stacks = {name: self._stack_stored(name) for name in self.stacked}
        self.fixes = self._stack_fixes()  # the fixes its problem lines suggest
        self.explained.update(n for n, stored in self._stored_stacks.items() if stored is None)
        self._results: dict[tuple[Rule, tuple[str, ...]], list[Any]] = {}
        # stacked leaves filled while another was assembled (the k and v a split gave with q)
        self._assembled: dict[str, Any] = {}

    def _refuse_shadowed(self, taken: Mapping[str, int]) -> None:
        """Refuse a rule whose every matching name an earlier rule reads (`taken`: name -> rule);
        a rule matching no name is fine (one table serves files with and without a tied head)."""
        used = set(taken.values())
        for number, rule in enumerate(self.rules):
            if number in used:
                continue
            if rule.captures:
                shadowed = [n for n in taken if any(r.fullmatch(n) for r in rule.regexes)]
            else:  # (names, not patterns: looked up)
                shadowed = [n for n in rule.sources if n in taken]
            if shadowed:
                earlier = " and ".join(dict.fromkeys(self.rules[taken[n]].text() for n in shadowed))
                raise ValueError(
                    f"{self.title}: key rule {rule.text()} matches "
                    f"{listed([repr(n) for n in shadowed], 3)} in {self.label}, but every one of "
                    f"them is read by an earlier key rule, {earlier}: rules are tried in order and "
                    "the first match wins, so this rule reads nothing. Put the narrower rule "
                    "first, or remove it"
                )

    def _add(self, name: str, mapped: _Mapped) -> None:
        other = self.mapped.setdefault(name, mapped)
        if other is not mapped:
            raise ValueError(
                f"{self.title}: key rules map both {list(other.sources)} and "
                f"{list(mapped.sources)} in {self.label} to {name!r}; make the rules tell "
                "them apart"
            )

    def names(self) -> Iterator[str]:
        yield from self.mapped
        yield from (name for name, stored in self._stored_stacks.items() if stored is not None)

    def expected(self, name: str) -> tuple[str, ...]:
        """The names a rule would read to give the missing `name` (a stack's first layer)."""
        layers = next((found for s in self.stacks if (found := s.per_layer(name))), [])
        for want in [name, *layers[:1]]:
            for number, _, match in target_hits(self.rules, want)[:1]:
                return tuple(fill(s, match.groupdict()) for s in self.rules[number].sources)
        return ()

    def sources(self, name: str) -> tuple[str, ...]:
        if name in self.stacked:
            slots = self.stacked[name].slots
            found = (s for slot in sorted(slots) for s in self.layers[slots[slot]].sources)
            return tuple(dict.fromkeys(found))
        return self.mapped[name].sources

    def stored(self, name: str) -> Stored | None:
        if name in self._stored_stacks:
            return self._stored_stacks[name]
        mapped = self.mapped.get(name)
        return None if mapped is None else self._stored_one(name, mapped)

    def _stored_one(self, name: str, mapped: _Mapped) -> Stored | None:
        if mapped.rule is None or mapped.rule.transform is None:
            return self.inner.stored(mapped.sources[0])
        out = self._checked(name, mapped)[mapped.position]
        return Stored(TENSOR, dtype_name(out), tuple(out.shape))

    def _stack_stored(self, whole: str) -> Stored | None:
        """A stacked leaf as its layers give it; None (and a problem) if they do not fit."""
        layers = self.stacked[whole]
        stack, slots = layers.stack, layers.slots
        count = stack.layers // stack.period
        first = slots[min(slots)]
        mapped = self.layers[first]
        via = f"key rule {mapped.rule.text()}" if mapped.rule is not None else "their own names"
        where = f"{whole!r} (a stack of {count} at {stack.prefix or 'the root'!r})"
        if len(slots) < count:
            held = stack.slots(whole)
            assert held is not None  # (`whole` is one of the stack's leaves)
            known = held[0][min(slots)]
            lacking = [layer for slot, layer in enumerate(held[0]) if slot not in slots]
            # the file's name the first lacking layer would be read from, by analogy
            segments = mapped.sources[0].split(".")
            source = ".".join(str(lacking[0]) if s == str(known) else s for s in segments)
            missed = f": no {source!r} in {self.label}" if segments.count(str(known)) == 1 else ""
            self.problems.append(
                f"incomplete  {where}: {self.label} gives {len(slots)} of its {count} layers "
                f"(through {via}); it lacks layer{'s' if len(lacking) > 1 else ''} "
                f"{listed(lacking, 6)}{missed}"
            )
            self._lacking[whole] = (stack, len(slots), tuple(lacking))
            return None
        base = None
        for slot in sorted(slots):
            name, origin = slots[slot], list(self.layers[slots[slot]].sources)
            part = self._stored_one(name, self.layers[name])
            if part is None or part.category != TENSOR:
                self.problems.append(
                    f"layers      {where}: {name!r} from {origin} is "
                    f"{'nothing' if part is None else part.describe()}, not an array"
                )
                return None
            base = part if base is None else base
            if (part.shape, part.dtype) != (base.shape, base.dtype):
                self.problems.append(
                    f"layers      {where}: layer {name!r} is {array_type(part.dtype, part.shape)} "
                    f"(from {origin}), layer {first!r} {array_type(base.dtype, base.shape)}: the "
                    "layers of a stack have one shape and dtype"
                )
                return None
        assert base is not None
        return Stored(TENSOR, base.dtype, (count, *base.shape))

    def _stack_fixes(self) -> list[str]:
        """The fixes for stacks lacking layers, and for layers beyond a stack."""
        fixes = []
        for stack, layers in self._beyond.items():
            fixes.append(
                f"- {self.label} holds layer{'s' if len(layers) > 1 else ''} "
                f"{listed(sorted(layers), 6)} beyond the {stack.layers} of the stack "
                f"at {stack.prefix or 'the root'!r}: build the template with "
                f"{max(layers) + 1} layers (the configuration the checkpoint was saved "
                'with), or leave them out with unexpected="ignore"'
            )
        for stack in dict.fromkeys(lacked[0] for lacked in self._lacking.values()):
            mine = [n for n, layers in self.stacked.items() if layers.stack == stack]
            given = {self._lacking[n][1:] if n in self._lacking else None for n in mine}
            found = next(iter(given)) if len(given) == 1 else None
            # every leaf has layers 0..depth-1 and lacks the rest: a shallower model's file
            depth = found[0] if found and found[1] == tuple(range(found[0], stack.layers)) else None
            where = stack.prefix or "the root"
            if depth is not None and stack.under is None:
                fixes.append(
                    f"- {self.label} holds the first {depth} layers of every leaf of the "
                    f"stack at {where!r}, which has {stack.layers}: build the template with "
                    f"{depth} blocks (the configuration the checkpoint was saved with)"
                )
                continue
            lacking = sorted({k for n in mine if n in self._lacking for k in self._lacking[n][2]})
            fixes.append(
                f"- {self.label} lacks layers of the stack at {where!r} "
                f"({listed(lacking, 6)}): it is incomplete, or a key rule's source "
                "misses their names (compare with the names the file holds)"
            )
        return fixes

    def _checked(self, name: str, mapped: _Mapped) -> list[Any]:
        """The transform's results traced on the sources' shapes and dtypes, one per target."""
        assert mapped.rule is not None
        parts = [self.inner.stored(source) for source in mapped.sources]
        if not all(p is not None and p.category == TENSOR for p in parts):
            raise ValueError(
                f"{self.title}: key rule {mapped.rule.text()} transforms "
                f"{list(mapped.sources)} in {self.label}, which are not all tensors"
            )
        inputs = tuple((p.shape, p.dtype) for p in parts if p is not None)
        key = (mapped.rule, inputs)
        if key not in self._abstract:
            structs = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in inputs]
            what = self._what(name, mapped)
            self._abstract[key] = outputs(
                what, mapped.rule, jax.eval_shape, structs, hint=_TRANSFORM_HINT
            )
        return self._abstract[key]

    def _what(self, name: str, mapped: _Mapped) -> str:
        assert mapped.rule is not None
        return (
            f"{self.title}: the transform of key rule {mapped.rule.text()} (for {name!r}, "
            f"from {list(mapped.sources)} in {self.label})"
        )

    def _run(self, name: str, mapped: _Mapped) -> list[Any]:
        assert mapped.rule is not None
        checked = self._checked(name, mapped)
        arrays = [self.inner.fetch(source) for source in mapped.sources]
        what = self._what(name, mapped)
        return outputs(what, mapped.rule, run_on, arrays, hint=_TRANSFORM_HINT, checked=checked)

    def _fetch_one(self, name: str, mapped: _Mapped) -> Any:
        if mapped.rule is None or mapped.rule.transform is None:
            return self.inner.fetch(mapped.sources[0])
        key = (mapped.rule, mapped.sources)
        if key not in self._results:
            # one group's results at a time: a split's parts are restored one after another
            self._results.clear()
            self._results[key] = self._run(name, mapped)
        return self._results[key][mapped.position]

    def fetch(self, name: str) -> Any:
        if name in self.stacked:
            return self._fetch_stacked(name, on_device=False)
        return self._fetch_one(name, self.mapped[name])

    def fetch_placed(self, name: str, template: Any) -> Any:
        """A stacked leaf assembled on a one-device template's device, else None."""
        if name not in self.stacked or isinstance(template, (np.ndarray, np.generic)):
            return None
        sharding = getattr(template, "sharding", None)
        if sharding is not None and len(sharding.device_set) > 1:
            return None  # (placed by the restore, from the whole stack)
        return self._fetch_stacked(name, on_device=True)

    def _fetch_stacked(self, whole: str, on_device: bool) -> Any:
        """A stacked leaf, each layer read once into one buffer (and a split's siblings)."""
        if whole in self._assembled:
            return self._assembled.pop(whole)
        buffers: dict[str, Any] = {}
        filled: dict[str, set[int]] = {}

        def put(target: str, slot: int, value: Any) -> None:
            if target not in buffers:
                stored = self._stored_stacks[target]
                assert stored is not None
                dtype = numpy_dtype(stored.dtype)
                if dtype is None:  # key data: no NumPy dtype to hold it
                    buffers[target] = [None] * stored.shape[0]
                elif on_device and jax.dtypes.canonicalize_dtype(dtype) == dtype:
                    buffers[target] = jax.numpy.zeros(stored.shape, dtype)
                else:
                    buffers[target] = np.empty(stored.shape, dtype)
                filled[target] = set()
            buffer = buffers[target]
            if isinstance(buffer, jax.Array):
                buffers[target] = _write_slot(buffer, value, slot)
                release_host_copy(buffers[target], getattr(value, "nbytes", 0))
            else:
                buffer[slot] = value  # (into the buffer: a copy of this layer alone)
            filled[target].add(slot)

        slots = self.stacked[whole].slots
        for slot in sorted(slots):
            mapped = self.layers[slots[slot]]
            if len(mapped.names) > 1:  # a split (a rule of several targets has a transform)
                results = self._run(slots[slot], mapped)
                for sibling, value in zip(mapped.names, results):
                    where = self._slot_of.get(sibling)
                    if where is None or self._stored_stacks.get(where[0]) is None:
                        continue  # a result outside the stacks: fetched on its own
                    if where[0] == whole or where[0] not in self._assembled:
                        put(where[0], where[1], value)
            else:
                put(whole, slot, self._fetch_one(slots[slot], mapped))
        for target, buffer in buffers.items():
            if isinstance(buffer, list) and len(filled[target]) == len(buffer):
                buffer = jax.numpy.stack(buffer)
            if target != whole and len(filled[target]) == len(self.stacked[target].slots):
                self._assembled[target] = buffer
            buffers[target] = buffer
        return buffers[whole]


@functools.partial(jax.jit, donate_argnums=0)
def _write_slot(buffer: jax.Array, value: Any, slot: Any) -> jax.Array:
    return jax.lax.dynamic_update_index_in_dim(buffer, value, slot, 0)


_TRANSFORM_HINT = (
    ". A transform gets NumPy arrays and, for the checks, jax.ShapeDtypeStructs: write it "
    "with jnp or array methods (`w.T`, `jnp.split(qkv, 3)`)"
)


def run_on(function: Callable[..., Any], *args: Any) -> Any:
    return function(*args)


def outputs(
    what: str,
    rule: Rule,
    run: Callable[..., Any],
    args: Sequence[Any],
    side: str = "targets",
    hint: str = "",
    checked: Sequence[Any] | None = None,
) -> list[Any]:
    """`run(transform, *args)` in the dtypes of `args` (the inverse for `side="sources"`),
    as one array per name of that side; `what` names it in errors. With `checked` (the
    results on shapes and dtypes alone), a result of another shape or dtype is an error:
    what is restored or written is what was checked (not a random or stateful transform)."""
    function = rule.transform if side == "targets" else rule.inverse
    try:
        with in_file_dtypes(dtype_name(a) for a in args):
            result = run(function, *args)
    except Exception as error:
        raise ValueError(f"{what} failed: {type(error).__name__}: {error}{hint}") from None
    names = rule.targets if side == "targets" else rule.sources
    count = len(names)
    if count == 1 and not _is_array(result):
        raise ValueError(
            f"{what} returned {_kind(result)}; a rule with one {side[:-1]} returns one array"
        )
    if count > 1 and not isinstance(result, (list, tuple)):
        raise ValueError(
            f"{what} returned {_kind(result)}; a rule with {count} {side} returns a list "
            f"or tuple of {count} arrays, one per {side[:-1]} in order"
        )
    results: list[Any] = [result] if count == 1 else list(result)
    if len(results) != count:
        raise ValueError(f"{what} returned {len(results)} values for {count} {side}")
    for name, value, expected in zip(names, results, checked or [None] * count):
        if not _is_array(value):
            raise ValueError(
                f"{what} returned {_kind(value)} for the {side[:-1]} {name!r}; each result "
                "is an array"
            )
        got = (dtype_name(value), tuple(value.shape))
        if expected is not None and got != (dtype_name(expected), tuple(expected.shape)):
            raise ValueError(
                f"{what} gave {array_type(*got)} for {name!r} when run, not the "
                f"{array_type(dtype_name(expected), tuple(expected.shape))} it gave while "
                "checked: a transform must compute the same from tensors of the same shapes "
                "and dtypes"
            )
    return results


def _is_array(value: Any) -> bool:
    return isinstance(value, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct))


def _kind(value: Any) -> str:
    if _is_array(value):
        return "one array"
    return "None" if value is None else f"a {type(value).__name__}"
