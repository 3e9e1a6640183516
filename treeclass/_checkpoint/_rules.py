"""Key rules: a checkpoint's names mapped to a model's key paths, with transforms.

A rule maps one or more *source* patterns (names in the checkpoint) to one or more
*target* patterns (the model's key paths), with named captures shared by both sides:

    ("model.layers.{i}.self_attn.q_proj.weight", "blocks[{i}].attn.q.weight", lambda w: w.T)

`{name}` captures one dot-separated segment, `{name*}` one or more. Targets may be written
as key paths (`blocks[{i}].attn`, `['key']`) or with dots. A rule with several sources
passes their tensors to its transform in order (concatenate a fused tensor); one with
several targets takes a sequence of as many results (split one). Names no rule matches
keep their own name. Rules are tried in order; the first match wins.

`RuledCatalog` applies a rule table to any catalog: the checks, the report and restoring
see the renamed, transformed names, and a dry run reads no tensor bytes (shapes and
dtypes come from `jax.eval_shape` of each transform).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax

from ._tree import TENSOR, Catalog, Stored, dtype_name, numpy_dtype

__all__ = ["Rule", "compile_rules", "RuledCatalog", "in_file_dtypes"]

_CAPTURE = re.compile(r"\{(\w+)(\*?)\}")
_BRACKET = re.compile(r"\[(?:'([^']*)'|\"([^\"]*)\"|([^\]]*))\]")


def _normalize(pattern: str) -> str:
    """A key-path pattern (`blocks[{i}].attn`, `['w']`) in the dot form names use."""
    dotted = _BRACKET.sub(lambda m: "." + next(g for g in m.groups() if g is not None), pattern)
    return dotted[1:] if dotted.startswith(".") else dotted


def _regex(pattern: str) -> tuple[re.Pattern[str], tuple[str, ...]]:
    parts, names, at = [], [], 0
    for match in _CAPTURE.finditer(pattern):
        parts.append(re.escape(pattern[at : match.start()]))
        name, many = match.groups()
        if name in names:
            parts.append(f"(?P={name})")
        else:
            parts.append(f"(?P<{name}>.+?)" if many else f"(?P<{name}>[^.]+)")
            names.append(name)
        at = match.end()
    parts.append(re.escape(pattern[at:]))
    return re.compile("".join(parts)), tuple(names)


class Rule(NamedTuple):
    """One compiled rule: source and target patterns, their captures, the transform."""

    sources: tuple[str, ...]
    targets: tuple[str, ...]
    transform: Callable[..., Any] | None
    regexes: tuple[re.Pattern[str], ...]
    captures: tuple[str, ...]

    def text(self) -> str:
        show = lambda names: names[0] if len(names) == 1 else list(names)  # noqa: E731
        return f"{show(self.sources)!r} -> {show(self.targets)!r}"


_BAD_RULE = (
    "A key rule is a (source, target) or (source, target, transform) tuple, or a dict "
    "{{source: target}}; got {rule!r}. Sources are the checkpoint's names with captures "
    "(`'layers.{{i}}.weight'`), targets the model's key paths (`'blocks[{{i}}].w'`)."
)


def compile_rules(rules: Any) -> tuple[Rule, ...]:
    """Check a rule table and compile its patterns; `ValueError`/`TypeError` naming a bad rule."""
    if isinstance(rules, Mapping):
        rules = list(rules.items())
    compiled = []
    for rule in rules:
        if not isinstance(rule, tuple) or len(rule) not in (2, 3):
            raise TypeError(_BAD_RULE.format(rule=rule))
        source, target = rule[0], rule[1]
        transform = rule[2] if len(rule) == 3 else None
        sources = (source,) if isinstance(source, str) else tuple(source)
        targets = (target,) if isinstance(target, str) else tuple(target)
        if not sources or not targets or not all(isinstance(p, str) for p in sources + targets):
            raise TypeError(_BAD_RULE.format(rule=rule))
        if transform is not None and not callable(transform):
            raise TypeError(f"The transform of key rule {rule!r} is not callable")
        if transform is None and (len(sources) > 1 or len(targets) > 1):
            raise ValueError(
                f"Key rule {rule!r} maps {len(sources)} names to {len(targets)}: it needs a "
                "transform (concatenate the sources, or split into the targets)"
            )
        targets = tuple(_normalize(t) for t in targets)
        regexes, names = zip(*(_regex(s) for s in sources))
        captured = set(names[0])
        for other in names[1:]:
            if set(other) != captured:
                raise ValueError(f"The sources of key rule {rule!r} capture different names")
        for target in targets:
            used = {m.group(1) for m in _CAPTURE.finditer(target)}
            if not used <= captured:
                raise ValueError(
                    f"Key rule {rule!r}: the target {target!r} uses {sorted(used - captured)}, "
                    "which no source captures"
                )
        compiled.append(Rule(sources, targets, transform, regexes, names[0]))
    return tuple(compiled)


def in_file_dtypes(names: Iterable[str]) -> contextlib.AbstractContextManager[Any]:
    """Where a transform of tensors with these dtype names runs, checked and run alike.

    With JAX's 64-bit types off, tracing makes a float64 (int64, complex128) tensor 32-bit:
    the check would report a dtype the run on NumPy arrays does not give. So a transform of
    a 64-bit tensor runs with them on; others keep JAX's defaults (`jnp.zeros` is float32).
    """
    # with 64-bit types on, no dtype canonicalizes to another one: nothing to switch
    found = [d for d in map(numpy_dtype, names) if d is not None]
    if any(jax.dtypes.canonicalize_dtype(d) != d for d in found):
        return jax.enable_x64(True)
    return contextlib.nullcontext()


def _fill(pattern: str, values: Mapping[str, str]) -> str:
    return _CAPTURE.sub(lambda m: values[m.group(1)], pattern)


class _Mapped(NamedTuple):
    rule: Rule | None  # None: a name no rule matched, under its own name
    sources: tuple[str, ...]  # the catalog's names read for it, in the rule's order
    position: int  # which of the rule's results


class RuledCatalog:
    """A catalog whose names are mapped by key rules (see the module's docstring)."""

    def __init__(self, inner: Catalog, rules: Sequence[Rule]) -> None:
        self.inner = inner
        self.label, self.title, self.call = inner.label, inner.title, inner.call
        self.records_values = inner.records_values
        self.rules = rules
        self.mapped: dict[str, _Mapped] = {}
        groups: dict[tuple[int, tuple[str, ...]], dict[int, str]] = {}
        for name in inner.names():
            for number, rule in enumerate(rules):
                hit = next(
                    ((k, m) for k, r in enumerate(rule.regexes) if (m := r.fullmatch(name))),
                    None,
                )
                if hit is not None:
                    which, match = hit
                    values = tuple(match.group(c) for c in rule.captures)
                    groups.setdefault((number, values), {})[which] = name
                    break
            else:
                self._add(name, _Mapped(None, (name,), 0))
        self.problems: list[str] = []
        for (number, values), found in groups.items():
            rule = rules[number]
            if len(found) < len(rule.sources):  # a concatenation lacks a part
                lacking = [_fill(s, dict(zip(rule.captures, values))) for s in rule.sources]
                self.problems.append(
                    f"incomplete  key rule {rule.text()} found {sorted(found.values())} in "
                    f"{self.label} but not {[n for n in lacking if n not in found.values()]}"
                )
                continue
            sources = tuple(found[k] for k in range(len(rule.sources)))
            captures = dict(zip(rule.captures, values))
            for position, target in enumerate(rule.targets):
                self._add(_fill(target, captures), _Mapped(rule, sources, position))
        # a transform's results by its inputs' shapes and dtypes: the 24 blocks of a model
        # are traced once, not 24 times
        self._abstract: dict[tuple[Rule, tuple[tuple, ...]], list[Any]] = {}
        self._results: dict[tuple[Rule, tuple[str, ...]], list[Any]] = {}

    def _add(self, name: str, mapped: _Mapped) -> None:
        other = self.mapped.setdefault(name, mapped)
        if other is not mapped:
            raise ValueError(
                f"{self.title}: key rules map both {list(other.sources)} and "
                f"{list(mapped.sources)} in {self.label} to {name!r}; make the rules tell "
                "them apart"
            )

    def names(self) -> Iterator[str]:
        return iter(self.mapped)

    def expected(self, name: str) -> tuple[str, ...]:
        """The names a rule would read to give `name`, when the checkpoint lacks `name`
        (empty if no rule's target gives it): for the closest-name hint of a missing path."""
        for rule in self.rules:
            for target in rule.targets:
                match = _regex(target)[0].fullmatch(name)
                if match is not None:
                    captures = match.groupdict()
                    return tuple(_fill(source, captures) for source in rule.sources)
        return ()

    def sources(self, name: str) -> tuple[str, ...]:
        """The names in the underlying checkpoint that `name` is made of."""
        return self.mapped[name].sources

    def stored(self, name: str) -> Stored | None:
        mapped = self.mapped.get(name)
        if mapped is None:
            return None
        if mapped.rule is None or mapped.rule.transform is None:
            return self.inner.stored(mapped.sources[0])
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
            with in_file_dtypes(dtype for _, dtype in inputs):
                self._abstract[key] = self._outputs(name, mapped, jax.eval_shape, structs)
        out = self._abstract[key][mapped.position]
        return Stored(TENSOR, dtype_name(out), tuple(out.shape))

    def _outputs(
        self, name: str, mapped: _Mapped, run: Callable[..., Any], args: list[Any]
    ) -> list[Any]:
        """The results of `mapped`'s transform (one per target), wanted for `name`."""
        rule = mapped.rule
        assert rule is not None and rule.transform is not None
        what = (
            f"{self.title}: the transform of key rule {rule.text()} (for {name!r}, from "
            f"{list(mapped.sources)} in {self.label})"
        )
        try:
            result = run(rule.transform, *args)
        except Exception as error:
            raise ValueError(
                f"{what} failed: {type(error).__name__}: {error}. A transform gets NumPy "
                "arrays and, for the checks, jax.ShapeDtypeStructs: write it with jnp or "
                "array methods (`w.T`, `jnp.split(qkv, 3)`)"
            ) from None
        if len(rule.targets) == 1:
            return [result]
        results = list(result)
        if len(results) != len(rule.targets):
            raise ValueError(
                f"{what} returned {len(results)} arrays for {len(rule.targets)} targets"
            )
        return results

    def fetch(self, name: str) -> Any:
        mapped = self.mapped[name]
        if mapped.rule is None or mapped.rule.transform is None:
            return self.inner.fetch(mapped.sources[0])
        key = (mapped.rule, mapped.sources)
        if key not in self._results:
            # one group's results at a time: a split's parts are restored one after another
            self._results.clear()
            arrays = [self.inner.fetch(source) for source in mapped.sources]
            with in_file_dtypes(dtype_name(a) for a in arrays):
                self._results[key] = self._outputs(name, mapped, lambda f, *a: f(*a), arrays)
        return self._results[key][mapped.position]
