"""Versioned models: a class's checkpoint version and migrations (`declare`), the stamp a
save writes (`class_versions`), and a file's catalog upgraded by them (`migrate`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.extend.core import Var

from ..._class_keywords import offer_class_check
from ..._structure import TREECLASS, is_wrapper, row_of, unwrap
from ..files._source import dtype_name, numpy_dtype
from ._catalog import Catalog, Stored, Wrapping
from ._fixes import listed
from ._rules import Rule, RuledCatalog, compile_rules, in_file_dtypes
from ._stacks import joined
from ._walk import PLAIN, TENSOR, is_plain, key_name


class _Step(NamedTuple):
    rules: tuple[Rule, ...] | None  # a rule table's step
    function: Callable[..., Any] | None  # a function's step: a mapping to a new mapping
    label: str  # "rules", or the function's name


class _Versions(NamedTuple):
    version: int
    steps: Mapping[int, _Step]  # from-version -> the step to the next version


_BAD_VERSION = (
    "class {cls}: version= takes its checkpoint version, an int >= 0; got {value!r}:\n"
    "    class {cls}(tc.TreeClass, version=2, migrations={{1: {{'w': 'weight'}}}}):"
)
_BAD_MIGRATIONS = (
    "class {cls}: migrations= maps a version before {version} to the step upgrading a checkpoint "
    "from it to the next ({{1: {{'w': 'weight'}}}} renames `w` from version 1 to 2); {problem}"
)


def declare(cls: type, version: Any, migrations: Any) -> None:
    """Check a class's `version=` and `migrations=` keywords and keep them on the class."""
    name = cls.__name__
    if version is None:
        if migrations is not None:
            raise TypeError(
                f"class {name}: migrations= needs version= (the version they lead up to)"
            )
        return
    if type(version) is not int or version < 0:
        raise TypeError(_BAD_VERSION.format(cls=name, value=version))
    migrations = {} if migrations is None else migrations
    if not isinstance(migrations, Mapping):
        problem = f"got a {type(migrations).__name__}"
        raise TypeError(_BAD_MIGRATIONS.format(cls=name, version=version, problem=problem))
    steps = {}
    for start, step in migrations.items():
        if type(start) is not int or not 0 <= start < version:
            problem = f"got the key {start!r}"
            raise ValueError(_BAD_MIGRATIONS.format(cls=name, version=version, problem=problem))
        if callable(step):
            label = getattr(step, "__name__", type(step).__name__)
            steps[start] = _Step(None, step, label)
            continue
        try:
            rules = compile_rules(step)
        except (TypeError, ValueError) as error:
            raise type(error)(
                f"class {name}: the migration from version {start} to {start + 1} is a "
                f"function or a rule table; {error}"
            ) from None
        steps[start] = _Step(rules, None, "rules")
    if steps:  # from the first step on, every version has its step: a hole is a step forgotten
        gaps = [v for v in range(min(steps), version) if v not in steps]
        if gaps:
            shown = ", ".join(f"{v} to {v + 1}" for v in gaps)
            problem = (
                f"it has steps from versions {sorted(steps)} but none from version {shown}: a "
                "checkpoint of that version would skip it. Give every step from the first on; a "
                f"version that renamed nothing takes an empty rule table ({{{gaps[0]}: {{}}}})"
            )
            raise ValueError(_BAD_MIGRATIONS.format(cls=name, version=version, problem=problem))
    record = _Versions(version, MappingProxyType(dict(sorted(steps.items()))))
    type.__setattr__(cls, "_tc_versions", record)


offer_class_check(("version", "migrations"), declare)


def version_of(cls: type) -> int:
    """The checkpoint version a TreeClass class declares (0 when it declares none)."""
    record: _Versions | None = getattr(cls, "_tc_versions", None)
    return 0 if record is None else record.version


def _classed(node: Any) -> bool:
    return row_of(node).kind == TREECLASS


def _nodes(tree: Any) -> Iterator[tuple[str, type]]:
    """`(checkpoint name, class)` of every TreeClass node, frozen ones included."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(tree, ())]
    while stack:
        node, path = stack.pop()
        node = unwrap(node)
        if _classed(node):
            yield ".".join(path), type(node)

        def stop(x: Any, node: Any = node) -> bool:
            return x is not node and (is_wrapper(x) or _classed(x))

        found = jax.tree_util.tree_flatten_with_path(node, is_leaf=stop)[0]
        for keys, child in reversed(found):
            if stop(child):
                stack.append((child, (*path, *map(key_name, keys))))


def _classes(tree: Any) -> dict[str, tuple[type, list[str]]]:
    """Every TreeClass class of `tree` by name, with the checkpoint names of its nodes."""
    found: dict[str, tuple[type, list[str]]] = {}
    for name, cls in _nodes(tree):
        other, at = found.setdefault(cls.__name__, (cls, []))
        if other is not cls and version_of(other) != version_of(cls):
            raise ValueError(
                f"two classes named {cls.__name__} ({other.__module__}.{other.__qualname__}, "
                f"version {version_of(other)}, and {cls.__module__}.{cls.__qualname__}, "
                f"version {version_of(cls)}) are in the tree: a checkpoint records versions "
                "by class name. Rename one of them."
            )
        at.append(name)
    return found


def class_versions(tree: Any) -> dict[str, dict[str, Any]]:
    """Every TreeClass class of `tree` by name: `{"Encoder": {"version": 2, "at": ["encoder"]}}`."""
    return {name: {"version": version_of(c), "at": at} for name, (c, at) in _classes(tree).items()}


_NEWER = (
    "{location} holds a `{cls}` saved at checkpoint version {saved}, newer than this "
    "`{cls}` (version {mine}): it was written by newer code. Load it with that code, or "
    "bring this class up to version {saved} (with the migrations that lead there)."
)


def migrate(catalog: Catalog, like: Any) -> Catalog:
    """`catalog` with the migrations of `like`'s classes applied, nested nodes first."""
    if not getattr(catalog, "records_values", False):
        return catalog
    stamps = getattr(catalog, "class_versions", None)
    location = getattr(catalog, "location", catalog.title)
    classes = _classes(like)
    if stamps is None:
        stamps = {name: {"version": 0, "at": at} for name, (_, at) in classes.items()}
    # (depth, class name) -> the file's key paths of its nodes
    levels: dict[tuple[int, str], list[str]] = {}
    for name, stamp in stamps.items():
        if name not in classes:
            continue
        saved, mine = stamp["version"], version_of(classes[name][0])
        if saved > mine:
            raise ValueError(_NEWER.format(location=location, cls=name, saved=saved, mine=mine))
        if saved < mine:
            for prefix in stamp["at"]:
                depth = 0 if not prefix else prefix.count(".") + 1
                levels.setdefault((depth, name), []).append(prefix)
    # the deepest nodes first: a class's steps then see its nested nodes' current names
    for depth, name in sorted(levels, key=lambda level: -level[0]):
        record: _Versions | None = getattr(classes[name][0], "_tc_versions", None)
        assert record is not None
        for start in range(stamps[name]["version"], record.version):
            step = record.steps.get(start)
            if step is not None:  # a version before the first step changed no names
                catalog = _Layer(catalog, levels[depth, name], step, name, start)
    return catalog


class _Subtree(Wrapping):
    """The names of a catalog under one node's prefix, relative to it."""

    def __init__(self, inner: Catalog, prefix: str, names: list[str]) -> None:
        super().__init__(inner)
        self.prefix, self.relative = prefix, names

    def names(self) -> Iterator[str]:
        return iter(self.relative)

    def stored(self, name: str) -> Stored | None:
        return self.inner.stored(joined(self.prefix, name))

    def fetch(self, name: str) -> Any:
        return self.inner.fetch(joined(self.prefix, name))


class NotLoaded:
    """What a function migration step sees for a value it cannot compute with (a function
    recorded by type, PRNG keys): returned under a new name, it is renamed."""

    __slots__ = ("name", "what")

    def __init__(self, name: str, what: str) -> None:
        self.name, self.what = name, what

    def __repr__(self) -> str:
        return f"<{self.what} {self.name!r}, not loaded>"


class _Output(NamedTuple):
    kind: str  # "renamed" (from `source`), "computed" (a tensor), "value" (a plain value)
    source: str | None
    stored: Stored
    depends: frozenset[str]  # computed: the input tensors it is computed from


class _FunctionStep(Wrapping):
    """A function migration step applied to one node's names."""

    def __init__(self, view: _Subtree, step: _Step, context: str) -> None:
        super().__init__(view)
        self.context = context
        self.function = step.function
        self.structs: dict[str, jax.ShapeDtypeStruct] = {}
        self.others: dict[str, Any] = {}  # plain values, and what is passed unloaded
        for name in view.names():
            stored = view.stored(name)
            assert stored is not None
            dtype = numpy_dtype(stored.dtype) if stored.category == TENSOR else None
            if dtype is not None:
                self.structs[name] = jax.ShapeDtypeStruct(stored.shape, dtype)
            elif stored.category == PLAIN:
                self.others[name] = stored.value
            else:
                what = "a tensor" if stored.category == TENSOR else f"a {stored.value}"
                self.others[name] = NotLoaded(name, what)
        self.outputs = self._trace()
        self._cache: dict[str, Any] = {}

    def _dtypes(self) -> Any:
        return in_file_dtypes(struct.dtype.name for struct in self.structs.values())

    def _fail(self, reason: str) -> ValueError:
        return ValueError(f"{self.title}: {self.context} {reason}")

    def _call(self, tensors: Mapping[str, Any]) -> dict[str, Any]:
        try:
            result = self.function(MappingProxyType({**tensors, **self.others}))  # type: ignore[misc]
        except Exception as error:
            raise self._fail(
                f"failed: {type(error).__name__}: {error}. A step gets the node's names "
                "mapped to arrays (jax.ShapeDtypeStructs while the template is checked: "
                "compute with jnp or array methods) and returns a new mapping"
            ) from None
        if not isinstance(result, Mapping):
            raise self._fail(
                f"returned a {type(result).__name__}; a step returns a mapping of names to "
                "arrays or values"
            )
        for bad in (key for key in result if not isinstance(key, str)):
            raise self._fail(
                f"returned the key {bad!r} (a {type(bad).__name__}) in its mapping; names "
                f"are strings, dot-joined as checkpoints name them ({str(bad)!r}, 'layers.0.w')"
            )
        return dict(result)

    def _trace(self) -> dict[str, _Output]:
        plain: dict[str, Any] = {}
        names: list[str] = []

        def traced(tensors: dict[str, Any]) -> dict[str, Any]:
            arrays = {}
            for key, value in self._call(tensors).items():
                if isinstance(value, (jax.Array, np.ndarray, np.generic)):
                    arrays[key] = value
                elif isinstance(value, NotLoaded) or is_plain(value):
                    plain[key] = value
                else:
                    raise self._fail(
                        f"returned a {type(value).__name__} for {key!r}: a step returns "
                        "arrays, plain values (numbers, strings), or what it was given"
                    )
            names.extend(sorted(arrays))
            return arrays

        with self._dtypes():
            closed, shapes = jax.make_jaxpr(traced, return_shape=True)(self.structs)
        jaxpr = closed.jaxpr
        inputs = dict(zip(jaxpr.invars, sorted(self.structs)))
        depends: dict[Any, frozenset[str]] = {var: frozenset({n}) for var, n in inputs.items()}
        for equation in jaxpr.eqns:
            used = frozenset().union(
                *(depends.get(v, frozenset()) for v in equation.invars if isinstance(v, Var))
            )
            for var in equation.outvars:
                depends[var] = used
        outputs: dict[str, _Output] = {}
        for name, var, shape in zip(names, jaxpr.outvars, jax.tree_util.tree_leaves(shapes)):
            if isinstance(var, Var) and var in inputs:
                source = inputs[var]
                outputs[name] = _Output("renamed", source, self._inner(source), frozenset())
            else:
                stored = Stored(TENSOR, dtype_name(shape), tuple(shape.shape))
                found = depends.get(var, frozenset()) if isinstance(var, Var) else frozenset()
                outputs[name] = _Output("computed", None, stored, found)
        for name, value in plain.items():
            if isinstance(value, NotLoaded):
                outputs[name] = _Output("renamed", value.name, self._inner(value.name), frozenset())
            else:
                given = next((k for k, v in self.others.items() if v is value), None)
                outputs[name] = _Output("value", given, Stored(PLAIN, value=value), frozenset())
        return outputs

    def _inner(self, name: str) -> Stored:
        stored = self.inner.stored(name)
        assert stored is not None
        return stored

    def names(self) -> Iterator[str]:
        return iter(self.outputs)

    def sources(self, name: str) -> tuple[str, ...]:
        output = self.outputs[name]
        if output.kind == "computed":
            return tuple(sorted(output.depends))
        return () if output.source is None else (output.source,)

    def stored(self, name: str) -> Stored | None:
        output = self.outputs.get(name)
        return None if output is None else output.stored

    def fetch(self, name: str) -> Any:
        output = self.outputs[name]
        if output.kind == "renamed":
            assert output.source is not None
            return self.inner.fetch(output.source)
        if output.kind == "value":
            return output.stored.value
        if name not in self._cache:
            # every computed result at once (a function is one call), each dropped once
            # restored; only the tensors they are computed from are read
            needed = frozenset().union(
                *(o.depends for o in self.outputs.values() if o.kind == "computed")
            )
            tensors = {
                n: self.inner.fetch(n) if n in needed else struct
                for n, struct in self.structs.items()
            }
            with self._dtypes():  # as when traced
                result = self._call(tensors)
            for key, output in self.outputs.items():
                if output.kind != "computed":
                    continue
                value, want = result.get(key), output.stored
                shape = getattr(value, "shape", None)
                if shape is None or (dtype_name(value), tuple(shape)) != (want.dtype, want.shape):
                    raise self._fail(
                        f"gave {key!r} as {value!r:.60} when run, not the "
                        f"{want.describe()[3:]} it gave while checked"
                    )
                self._cache[key] = value
        return self._cache.pop(name)


class _Layer(Wrapping):
    """One migration step of one class, applied to each of its nodes at one depth."""

    def __init__(
        self, inner: Catalog, prefixes: list[str], step: _Step, cls: str, start: int
    ) -> None:
        super().__init__(inner)
        shown = listed([p or "the root" for p in prefixes], 3)
        # the report's line, and the context of an error
        self.migration = f"{cls} {start} -> {start + 1} ({step.label}) at {shown}"
        self.context = (
            f"the migration of `{cls}` from version {start} to {start + 1} ({step.label}) at"
        )
        groups: dict[str, list[str]] = {p: [] for p in prefixes}
        # each name to the step's view of its node, or as it is (`None`), with the prefix
        self.mapped: dict[str, tuple[Any, str, str]] = {}
        for name in inner.names():
            parts = name.split(".")
            heads = ["", *(".".join(parts[:k]) for k in range(1, len(parts)))]
            owner = next((p for p in heads if p in groups), None)
            if owner is None:
                self.mapped[name] = (None, name, "")
            else:
                groups[owner].append(name)
        self.problems = list(inner.problems)
        for prefix, names in groups.items():
            cut = len(prefix) + 1 if prefix else 0
            view = _Subtree(inner, prefix, [n[cut:] for n in names])
            context = f"{self.context} {prefix or 'the root'}"
            if step.rules is None:
                part: Any = _FunctionStep(view, step, context)
            else:
                try:
                    part = RuledCatalog(view, step.rules)
                except ValueError as error:
                    raise ValueError(f"{error} (in {context})") from None
            self.problems.extend(f"{line} (in {context})" for line in part.problems)
            for name in part.names():
                full = joined(prefix, name)
                if self.mapped.setdefault(full, (part, name, prefix))[0] is not part:
                    raise ValueError(
                        f"{self.title}: {context} makes the name {full!r}, which the "
                        f"{self.label} holds already; make the step tell them apart"
                    )

    def names(self) -> Iterator[str]:
        return iter(self.mapped)

    def sources(self, name: str) -> tuple[str, ...]:
        part, inner_name, prefix = self.mapped[name]
        if part is None:
            return (name,)
        return tuple(joined(prefix, n) for n in part.sources(inner_name))

    def stored(self, name: str) -> Stored | None:
        found = self.mapped.get(name)
        return None if found is None else self._within(found, "stored")

    def fetch(self, name: str) -> Any:
        return self._within(self.mapped[name], "fetch")

    def _within(self, found: tuple[Any, str, str], method: str) -> Any:
        part, inner_name, prefix = found
        try:
            return getattr(self.inner if part is None else part, method)(inner_name)
        except ValueError as error:
            if part is None or isinstance(part, _FunctionStep):
                raise  # its errors say where they come from
            raise ValueError(f"{error} (in {self.context} {prefix or 'the root'})") from None
