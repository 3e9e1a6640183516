"""Checking a template against a catalog: each entry taken, kept or skipped, values
compared as `_values.exact_key` does, every problem collected into the `LoadReport` (a
value: hashable, compared by items)."""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..._values import exact_key, host_bytes, is_prng_key, path_str, short_repr
from ..files._source import dtype_name, is_weak, numpy_dtype
from ._catalog import Catalog, Stored, describe
from ._walk import NUMBER, NUMBERS, OBJECT, PLAIN, STATIC, TENSOR, Entry, is_abstract, static_parts

# what to do with a template entry: take the value from the catalog, keep the template's, or
# skip it (outside a partial load's selection: kept, and not reported)
TAKE, KEEP, SKIP = "take", "keep", "skip"


class FrozenMapping(Mapping[str, tuple[str, ...]]):
    """A read-only mapping that is a value: hashable, equal (as any `Mapping`) to any mapping
    of its items."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, tuple[str, ...]] | None = None) -> None:
        self._items = dict(items or {})

    def __getitem__(self, key: str) -> tuple[str, ...]:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __repr__(self) -> str:
        return repr(self._items)


class LoadReport(NamedTuple):
    """What `load` / `from_state_dict` with `strict=False` could not restore.

    - `missing`: key paths of the template (`MLP.layers[0].weight`) with no value in the
      checkpoint: they keep the template's value.
    - `mismatched`: key paths whose checkpoint value has another shape, dtype or type, or
      whose static value differs: they keep the template's value.
    - `unexpected`: names in the checkpoint (`layers.2.weight`) with no place in the
      template: ignored.
    - `messages`: one line per problem, as `strict=True` would report it.
    - `restored`: key paths whose value came from the checkpoint.
    - `sources`: for each restored path, the checkpoint names it was read from (one,
      or several when a key rule concatenated them).
    - `migrations`: the migration steps of versioned classes that ran, in order
      (`"Encoder 1 -> 2 (rules) at encoder"`); see the class keyword `version=`.

    `kept` is `missing + mismatched`: every path left at the template's value. Key paths
    outside a partial load's selection appear nowhere.

    ```python
    import os, tempfile
    import jax.numpy as jnp
    import treeclass as tc

    path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
    tc.save(path, {"w": jnp.ones(2)})
    restored, report = tc.load(path, {"w": jnp.zeros(2), "b": jnp.zeros(1)}, strict=False)
    assert report.restored == ("tree['w']",) and report.missing == report.kept == ("tree['b']",)
    ```
    """

    missing: tuple[str, ...]
    mismatched: tuple[str, ...]
    unexpected: tuple[str, ...]
    messages: tuple[str, ...]
    restored: tuple[str, ...] = ()
    sources: Mapping[str, tuple[str, ...]] = FrozenMapping()
    migrations: tuple[str, ...] = ()

    @property
    def kept(self) -> tuple[str, ...]:
        return self.missing + self.mismatched


class Checker:
    """Compares every template entry with the catalog, collecting all problems at once."""

    def __init__(self, like: object, source: Catalog, dry_run: bool = False) -> None:
        self.like = like
        self.source = source
        self.dry_run = dry_run  # no tensor bytes are read: static arrays are not compared
        self.used: set[str] = set()
        self.missing: list[str] = []
        self.messages: list[Any] = []  # lines, or (path, name) of a missing entry
        # (kind, path, entry, stored) of each problem, for the fixes an error suggests
        self.problem_entries: list[tuple[str, str, Entry, Stored | None]] = []
        self.unused: list[str] = []

    def decide(self, entry: Entry, selected: bool = True) -> str:
        """What to do with `entry`; outside a partial load's selection, SKIP (its name in the
        checkpoint is not unexpected)."""
        stored = self.source.stored(entry.name)
        if stored is not None:
            self.used.add(entry.name)
        if not selected:
            return SKIP
        where = path_str(self.like, entry.path)
        if stored is None:
            # strings, objects and static values are in treeclass's own files alone
            if not (entry.is_data or self.source.records_values):
                return KEEP
            return self._missing(where, entry)
        if entry.category == OBJECT:
            # never saved, so any non-data value of the file fits (a function where the
            # template holds a jitted one); data, or a static container of another type, not
            if stored.category == OBJECT and (
                stored.value == type(entry.value).__name__ or not static_parts(entry.value)
            ):
                return KEEP
            return self._mismatch(where, entry, stored, "type")
        if entry.kind == STATIC:
            return self._static(where, entry, stored)
        if entry.category == TENSOR and stored.category == TENSOR:
            return self._tensor_fits(where, entry, stored) or TAKE
        if entry.category == TENSOR:
            fits = _abstract_number_fits(entry.value, stored)
        elif entry.category == NUMBER:
            fits = _number_fits(entry.value, stored)
        else:
            fits = stored.category == PLAIN and type(stored.value) is type(entry.value)
        return TAKE if fits else self._mismatch(where, entry, stored, "type")

    def _tensor_fits(self, where: str, entry: Entry, stored: Stored) -> str | None:
        dtype, shape = dtype_name(entry.value), tuple(entry.value.shape)
        if stored.shape != shape:
            return self._mismatch(where, entry, stored, "shape")
        if stored.dtype != dtype:
            return self._mismatch(where, entry, stored, "dtype")
        return None

    def _static(self, where: str, entry: Entry, stored: Stored) -> str:
        """A static field is never restored: it is checked to equal what was saved."""
        if entry.category == TENSOR:
            if stored.category != TENSOR:
                return self._mismatch(where, entry, stored, "static")
            mismatch = self._tensor_fits(where, entry, stored)
            if mismatch is not None:
                return mismatch
            if stored.weak is not None and stored.weak != is_weak(entry.value):
                return self._mismatch(where, entry, stored, "static")
            if is_abstract(entry.value) or self.dry_run:
                return KEEP  # nothing to compare the saved values with, or not now
            saved = self.source.fetch(entry.name)
            if np.array_equal(host_bytes(saved), host_bytes(entry.value)):
                return KEEP
            return self._mismatch(where, entry, stored, "static", saved)
        # exactly when the two would be the same constant of a traced computation
        if stored.category == PLAIN and exact_key(entry.value) == exact_key(stored.value):
            return KEEP
        return self._mismatch(where, entry, stored, "static")

    def _missing(self, where: str, entry: Entry) -> str:
        self.missing.append(where)
        if entry.name in getattr(self.source, "explained", ()):
            return KEEP  # the catalog's own problem line says why (a stack lacks layers)
        self.problem_entries.append(("missing", where, entry, None))
        # the hint is added by `finish`, which knows which names no entry used
        self.messages.append((where, entry.name))
        return KEEP

    def _mismatch(
        self, where: str, entry: Entry, stored: Stored, what: str, saved: Any = None
    ) -> str:
        what = "static" if entry.kind == STATIC else what
        self.problem_entries.append((what, where, entry, stored))
        mine, theirs = describe(entry.value), stored.describe()
        if saved is not None:  # a static array: show the values that differ
            mine = f"{mine} {_shown_values(entry.value)}"
            theirs = f"{theirs} {_shown_values(saved)}"
        elif is_weak(entry.value) != bool(stored.weak) and stored.weak is not None:
            mine += " (weakly typed)" if is_weak(entry.value) else " (strongly typed)"
            theirs += " (weakly typed)" if stored.weak else " (strongly typed)"
        self.messages.append(
            f"{what:<11} {where}: {mine} in the template, {theirs} in {self.source.label}"
        )
        return KEEP

    def _hint(self, name: str, closest: _Closest) -> str:
        # a key rule that should have given `name`: the file's name it reads, and the
        # closest the file has to that (a typo in the rule, or another naming)
        expected = getattr(self.source, "expected", None)
        wanted = expected(name) if expected is not None else ()
        if wanted:
            close = [c for c in map(closest, wanted) if c is not None]
            hint = f" (a key rule reads it from {', '.join(map(repr, wanted))}"
            return hint + (f"; closest: {', '.join(map(repr, close))})" if close else ")")
        close_name = closest(name)
        return f" (closest: {close_name!r})" if close_name is not None else ""

    def finish(
        self, found: list[Entry], decisions: list[str], problems: Sequence[str]
    ) -> LoadReport:
        """The report, once every entry is decided: unexpected names and missing hints."""
        self.unused = unused = [name for name in self.source.names() if name not in self.used]
        self.closest = closest = _Closest(unused)
        label = self.source.label
        messages = []
        for message in self.messages:
            if isinstance(message, tuple):  # a missing entry: hint at a renamed one
                where, name = message
                message = f"missing     {where}: no {name!r} in {label}{self._hint(name, closest)}"
            messages.append(message)
        for name in unused:
            stored = self.source.stored(name)
            assert stored is not None  # a name the catalog listed
            origins = _origins(self.source, name)
            read = f" (read from {', '.join(map(repr, origins))})" if origins != (name,) else ""
            messages.append(
                f"unexpected  {name!r} ({stored.describe()}) in {label}{read}: "
                "the template has no such path"
            )
        messages.extend(problems)
        restored = [(e, path_str(self.like, e.path)) for e, d in zip(found, decisions) if d == TAKE]
        sources = {where: _origins(self.source, e.name) for e, where in restored}
        return LoadReport(
            tuple(self.missing),
            tuple(where for kind, where, _, _ in self.problem_entries if kind != "missing"),
            tuple(unused),
            tuple(messages),
            tuple(where for _, where in restored),
            FrozenMapping(sources),
            _migrations(self.source),
        )


def _origins(catalog: Any, name: str) -> tuple[str, ...]:
    """The names in the file itself that `name` of a chain of catalogs is made of."""
    names: tuple[str, ...] = (name,)
    while hasattr(catalog, "inner") and hasattr(catalog, "sources"):
        names = tuple(dict.fromkeys(n for own in names for n in catalog.sources(own)))
        catalog = catalog.inner
    return names


def _migrations(catalog: Any) -> tuple[str, ...]:
    """The migration steps in a chain of catalogs (each one's `migration`), in order."""
    ran = []
    while catalog is not None:
        if getattr(catalog, "migration", None) is not None:
            ran.append(catalog.migration)
        catalog = getattr(catalog, "inner", None)
    return tuple(reversed(ran))


def _shown_values(array: Any) -> str:
    """An array's values (a key's data) on one line, shortened, for a message."""
    if is_prng_key(array):
        array = jax.random.key_data(array)
    return short_repr(np.array2string(np.asarray(array), threshold=8, separator=","), 60, str)


def similarity(a: str, b: str) -> float:
    """The share of two names in a common prefix and suffix (difflib's ratio of those)."""
    shared = len(os.path.commonprefix([a, b])) + len(os.path.commonprefix([a[::-1], b[::-1]]))
    return 2 * min(shared, len(a), len(b)) / (len(a) + len(b) or 1)


class _Closest:
    """The closest of many names to a missing one, scoring only its sorted neighbours."""

    _CUTOFF = 0.6

    def __init__(self, names: list[str]) -> None:
        self.forward = sorted(names)
        self.backward = sorted(name[::-1] for name in names)

    @staticmethod
    def _near(ordered: list[str], key: str) -> list[str]:
        # the longest common prefix with `key` is had by one of its two neighbours
        at = bisect.bisect_left(ordered, key)
        return ordered[max(at - 1, 0) : at + 1]

    def __call__(self, name: str) -> str | None:
        candidates = set(self._near(self.forward, name))
        candidates.update(n[::-1] for n in self._near(self.backward, name[::-1]))
        best, best_score = None, self._CUTOFF
        for candidate in sorted(candidates):
            score = similarity(name, candidate)
            if score > best_score or (score == best_score and best is None):
                best, best_score = candidate, score
        return best


def _is_kind_of(dtype: np.dtype, kind: type, widening: bool = False) -> bool:
    """Whether `dtype` holds Python numbers of type `kind` (`widening`: floats as complex)."""
    if kind is bool:
        return dtype == np.bool_
    if kind is int:
        return bool(np.issubdtype(dtype, np.integer))
    wanted = np.floating if kind is float else np.inexact if widening else np.complexfloating
    return bool(jnp.issubdtype(dtype, wanted))


def _number_fits(template: Any, stored: Stored) -> bool:
    """Whether the stored value converts exactly to the template's Python number type."""
    if stored.category == TENSOR:  # a scalar of a numeric dtype (a key's has no NumPy dtype)
        dtype = numpy_dtype(stored.dtype) if stored.shape == () else None
        return dtype is not None and _is_kind_of(dtype, type(template), widening=True)
    return stored.category == PLAIN and to_number(template, stored.value) is not None


def _abstract_number_fits(template: Any, stored: Stored) -> bool:
    """A Python number saved where an abstract template has a 0-d scalar of its kind."""
    if not is_abstract(template) or template.shape != () or is_prng_key(template):
        return False
    kind = type(stored.value)
    return kind in NUMBERS and _is_kind_of(np.dtype(template.dtype), kind)


def to_number(template: bool | int | float | complex, value: Any) -> Any:
    """`value` (a number or a 0-d array) as the template's Python type, or None."""
    kind = type(template)
    if isinstance(value, (jax.Array, np.ndarray, np.generic)):
        value = np.asarray(value).item()
    if type(value) is bool or kind is bool:
        return value if type(value) is kind else None
    allowed = {int: (int,), float: (int, float), complex: (int, float, complex)}[kind]
    return kind(value) if type(value) in allowed else None
