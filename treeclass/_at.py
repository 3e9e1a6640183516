"""The `.at[...]` indexer: select parts of any pytree and get a new tree back.

Selectors are compiled once, when indexed (`_selectors`); an operation selects (one walk,
`_selection.select`; a chain of names and indices is followed by the rows alone), then
puts its values at the selected spots (`_Run`), rebuilding only the nodes on the way.
Every error raised by a user function (`apply`, `scan`, `reduce`, a `where` predicate)
gets a note naming the key path it was called at.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar, overload

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from jax.tree_util import tree_flatten_with_path, tree_leaves, tree_structure
from jax.typing import ArrayLike

from ._calls import call_on_copy, method_of
from ._numbers import (
    NUMBER_TYPES,
    NumberRangeError,
    dtype_kind,
    dtype_name,
    number_misfit,
    number_repr,
    number_value,
    plain_float_limit,
)
from ._selection import (
    ARRAY_CLASSES,
    Selection,
    Spot,
    aligned_mask,
    broadcasts_to,
    check_element_mask,
    note_blocked,
    select,
    shape_of,
)
from ._selectors import (
    IndexMatcher,
    MaskMatcher,
    Matcher,
    NameMatcher,
    compile_selector,
    def_rule,
    slice_text,
)
from ._structure import (
    describe,
    entry_name,
    is_leaf_node,
    path_str,
    root_name,
    row_of,
    wrapper_of,
)
from ._util import add_leaf_note, check_callable, leaf_path_str
from ._values import readable_here, sharding_spec, short_repr

T = TypeVar("T")
_A = TypeVar("_A")  # a fold's initial accumulator
_R = TypeVar("_R")  # what a fold's function returns
_S = TypeVar("_S")  # a scan's state
_MISSING: Any = object()

WRAPPED_FILL_MSG = (
    "Cannot put a number at {where}: the leaf is an array inside {what}, which a number fills "
    "keeping its shape and dtype, but its kind of node gives no way to wrap the filled array "
    "again (its row's `Wrapper.rewrap` is None). Put a whole value instead:\n"
    "    before: tree.at[where].set(0.0, is_leaf=...)\n"
    "    after:  tree.at[where].apply(lambda w: <w's kind around a filled array>, is_leaf=...)"
)
TRACED_MASK_GET_MSG = (
    "Cannot take `leaf[mask]` at {where}: the element mask is traced (inside `jax.jit`, "
    "`vmap` or `grad`), and the result's shape would depend on its values. Keep the leaf's "
    "shape by filling unselected elements instead:\n"
    "    before: tree.at[mask].get()\n"
    "    after:  tree.at[mask].get(fill_value=0)   # jnp.where(mask, leaf, 0)"
)
TRACED_MASK_REDUCE_MSG = (
    "`.reduce` cannot fold the elements an element mask selects at {where}: the mask is "
    "traced (inside `jax.jit`, `vmap` or `grad`), and `leaf[mask]` would have a shape that "
    "depends on its values. Fill the unselected elements with a value that leaves your fold "
    "unchanged (0 for a sum, 1 for a product, -inf for a max), then fold whole leaves:\n"
    "    before: tree.at[mask].reduce(fn, initializer=init)\n"
    "    after:  filled = tree.at[mask].get(fill_value=0)   # jnp.where(mask, leaf, 0)\n"
    "            tc.at(filled)[...].reduce(fn, initializer=init)"
)
TRACED_MASK_PLUCK_MSG = (
    "`.pluck` cannot take `leaf[mask]` at {where}: the element mask is traced (inside "
    "`jax.jit`, `vmap` or `grad`), and the result's shape would depend on its values. Take "
    "whole leaves with the unselected elements filled instead:\n"
    "    before: tree.at[mask].pluck()\n"
    "    after:  jax.tree_util.tree_leaves(tree.at[mask].get(fill_value=0))"
)
UNREADABLE_MASK_GET_MSG = (
    "Cannot take `leaf[mask]` at {where}: the element mask is a jax.Array placed on "
    "devices of several processes (sharding {spec}), so this process alone cannot read "
    "which elements it selects, and the result's shape depends on that. Keep the leaf's shape and "
    "sharding by filling unselected elements instead (on every process):\n"
    "    before: tree.at[mask].get()\n"
    "    after:  tree.at[mask].get(fill_value=0)   # jnp.where(mask, leaf, 0)\n"
    "or make the mask readable on every process first, e.g. with "
    "`jax.experimental.multihost_utils.process_allgather`."
)
ELEMENT_VALUE_TYPE_MSG = (
    "Cannot write {value} into elements of the leaf at {where}: an element mask selects "
    "elements of an array, so the new value must be an array or a number that fits them. "
    "A part of an array cannot be frozen or replaced by a subtree; select the whole leaf "
    "instead (a name, or a bool for the leaf rather than an array of bools):\n"
    "    before: tree.at[element_mask].apply(tc.freeze)\n"
    "    after:  tree.at['name'].apply(tc.freeze)"
)
ELEMENT_VALUE_SHAPE_MSG = (
    "Cannot set elements of the leaf at {where} (shape {leaf_shape}) to a value of shape "
    "{value_shape}: under an element mask the leaf keeps its shape, so the value must "
    "broadcast to it."
)
WHERE_TYPE_MSG = (
    "`where` is the sequence of selectors, one per level: `tc.at(tree, where=['a', 0])` is "
    "`tc.at(tree)['a'][0]`; got {value}. For one selector, pass a one-item list: "
    "`where=[selector]`."
)
PLUCK_COUNT_MSG = (
    "`AtIndexer.pluck` expects `count` to be None (every selected subtree) or an int >= 0, "
    "got {value!r}."
)
WHOLE_ELEMENT_MASK_MSG = (
    "`.apply(fn, whole=True)` calls `fn` on each selected node, but at {where} the "
    "selection is an element mask (it picks elements of a leaf, not a node). Select whole "
    "nodes (a name, a class, `tc.where` returning a bool), or drop `whole=True`."
)
STATIC_UNSET_MSG = (
    "{where} is a static field that this instance never set: there is no value to "
    "{name!r} to change. Set it in `__init__` (or give the field a default)."
)
WHOLE_TYPE_MSG = "`AtIndexer.apply` takes `whole` as a bool, got {value!r}."
EMPTY_REDUCE_MSG = (
    "`reduce` over an empty selection {selection} needs an initializer: "
    "`.reduce(fn, initializer=...)`."
)
CALL_NEEDS_NAME_MSG = (
    "Only a method name can be called: `tree.at['method'](*args, **kwargs)` (optionally "
    "after names and indices, `tree.at['child']['method']()`), got `{selection}(...)`."
)
ITERATION_MSG = (
    "An `AtIndexer` cannot be iterated: index it (`tree.at['name']`) and call an operation "
    "(`.get()`, `.set(v)`, `.apply(fn)`, `.reduce(fn)`, `.scan(fn, state)`)."
)
SCAN_RESULT_MSG = (
    "The scan function must return a pair `(new_leaf, new_state)`, but at {where} it "
    "returned {value}."
)
PARALLEL_ARG_MSG = (
    "`is_parallel` must be True, False, or a dict of `concurrent.futures.ThreadPoolExecutor` "
    "keyword arguments (e.g. {{'max_workers': 4}}), got {value!r}."
)
PARALLEL_TRACED_MSG = (
    "`is_parallel` cannot be used on traced values (inside `jax.jit`, `vmap` or `grad`): the "
    "{what} at {where} is (or holds) a tracer, and tracing on other threads would leak it. "
    "Run the parallel operation outside the transformation, or drop `is_parallel`."
)
FN_NOTE = "raised by `{fn}` at {where} (in {selection})"
NUMBER_MISFIT_MSG = (
    "Cannot put {value} into the array leaf at {where} ({leaf}): {reason}. A number set at "
    "an array leaf (or returned for one by `apply` or `scan`) becomes an array of the "
    "leaf's shape and dtype, as `x.at[...].set(v)` does in jax.numpy, so the leaf stays an "
    "array with its role (a trainable parameter stays trainable). Give a value of the "
    "leaf's kind:\n"
    "    before: tree.at[...].set({value})\n"
    "    after:  tree.at[...].set({fix})\n"
    "or, to put the number itself in place of the array (model surgery: the leaf stops "
    "being an array), `tree.at[...].apply(lambda _: {value}, whole=True)`."
)


def _short_repr(x: object, limit: int = 40) -> str:
    if type(x) is slice:
        return slice_text(x)
    if isinstance(x, type):
        return x.__name__
    text = short_repr(x, None)
    if "\n" in text:  # a multi-line repr (a mask tree): name its type only
        return f"<{type(x).__name__} mask>"
    return short_repr(text, limit, str)


def _selection_str(root: object, where: tuple[Any, ...]) -> str:
    return root_name(root) + ".at" + "".join(f"[{_short_repr(s)}]" for s in where)


def _note_fn(error: BaseException, fn: object, where: str, selection: str) -> None:
    """Name the leaf (and the selection) on an error the user's `fn` raised."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    add_leaf_note(error, FN_NOTE.format(fn=name, where=where, selection=selection))


def _is_element_value(x: object) -> bool:
    # what `jnp.where` can take elements from: arrays, scalars (also NumPy's), tracers
    return isinstance(x, (jax.Array, np.ndarray, np.generic, bool, int, float, complex))


def _masked(mask: Any, new: Any, old: Any, where: Callable[[], str]) -> Any:
    """`jnp.where(mask, new, old)`, which must keep `old`'s shape."""
    if not _is_element_value(new):
        raise TypeError(ELEMENT_VALUE_TYPE_MSG.format(where=where(), value=short_repr(new)))
    check_element_mask(mask, old, where)
    old_shape, new_shape = shape_of(old), shape_of(new)
    if not broadcasts_to(new_shape, old_shape):
        shapes = {"leaf_shape": old_shape, "value_shape": new_shape}
        raise ValueError(ELEMENT_VALUE_SHAPE_MSG.format(where=where(), **shapes))
    if type(new) in NUMBER_TYPES and _holds_numbers(old):
        # checked against the leaf's dtype (a bool too: into elements it is a number), and
        # weak: `where` keeps that dtype
        new = _number_fit(new, old, where)
    if type(old) is np.ndarray and isinstance(mask, (np.ndarray, np.bool_, bool)):
        if not isinstance(new, jax.Array):  # NumPy's for a NumPy leaf: its type and dtype stay
            return np.where(mask, new, old)
    return jnp.where(mask, new, old)


def _take(x: Any, mask: Any, fill_value: Any, where: Callable[[], str], traced_msg: str) -> Any:
    """The selected elements of leaf `x`: `x[mask]`, or `jnp.where` when there is a fill."""
    check_element_mask(mask, x, where)
    if fill_value is not None:
        return jnp.where(mask, x, fill_value)
    if isinstance(mask, Tracer):
        raise TypeError(traced_msg.format(where=where()))
    if not readable_here(mask):
        # many hosts: the selected positions must be read, and JAX reads such a mask on no
        # process alone
        raise ValueError(UNREADABLE_MASK_GET_MSG.format(where=where(), spec=sharding_spec(mask)))
    if not isinstance(x, (jax.Array, np.ndarray)):
        x = jnp.asarray(x)
    return x[jnp.broadcast_to(mask, x.shape)]


# the numbers (`_numbers.is_number`) a whole array leaf is filled with: `True` and `False`
# (and NumPy's) are flags there, put as they are; into elements (a mask) they are numbers
_FLAGS = frozenset({bool, np.bool_})
_FILLS = NUMBER_TYPES - _FLAGS
_SCALARS = frozenset({int, float, bool, complex})  # plain Python scalars: never arrays
_NUMPY_NUMBERS = NUMBER_TYPES - _SCALARS


def _holds_numbers(leaf: object) -> bool:
    """Whether a number put at `leaf` is fitted into it: an array, or a NumPy number."""
    return isinstance(leaf, (jax.Array, np.ndarray)) or type(leaf) in _NUMPY_NUMBERS


def _number_fit(value: Any, leaf: Any, where: Callable[[], str]) -> Any:
    """`value` (a number) as a weak Python number of `leaf`'s kind, which never widens its
    dtype (`0.0` for an int leaf is `0`), or an error naming `where`."""
    dtype = leaf.dtype
    if type(value) is float:
        limit = plain_float_limit(dtype)
        if limit is not None and -limit < value < limit:
            return value  # the common case, `.at[x > 0].set(0.0)`, in one comparison
    misfit = number_misfit(value, dtype)
    if misfit is None:
        return number_value(value, dtype)
    error, reason = misfit
    if dtype_kind(dtype) == "V":
        fix = "<an array of that dtype>"
    elif error is NumberRangeError:
        fix = "<a number in that range>"
    else:
        real = value.real if isinstance(value, complex) else value
        integral = dtype_kind(dtype) in "biu" and isinstance(real, int | float)
        fix = repr(round(real)) if integral and math.isfinite(real) else "<a number>"
    shown = f"{dtype_name(dtype)}{list(leaf.shape)}"
    message = NUMBER_MISFIT_MSG.format(
        value=number_repr(value), where=where(), leaf=shown, reason=reason, fix=fix
    )
    raise error(message)


def _fill(value: Any, leaf: Any, where: Callable[[Any], str], at: object) -> Any:
    """An array of `leaf`'s shape and dtype (and type: JAX or NumPy) filled with `value`."""
    value = _number_fit(value, leaf, lambda: where(at))
    if isinstance(leaf, np.ndarray):
        # assigned, not `np.full_like`: that rounds through float32 for ml_dtypes, which
        # turns a tiny number into nan in float8_e8m0fnu instead of its smallest value
        out = np.empty_like(leaf)
        out[...] = value
        return out
    if isinstance(leaf, np.generic):
        return leaf.dtype.type(value)
    return jnp.full_like(leaf, value)  # keeps the sharding, and a weak type


def _keep_array(new: object, leaf: object, where: Callable[[Any], str], at: object) -> Any:
    """`new` put at the whole leaf `leaf`: a number at an array leaf fills the array, inside
    its wrapper for a wrapped one (a number cannot mean "unfreeze this parameter").
    `where(at)` names the leaf, worked out only for an error."""
    if type(new) not in _FILLS or type(leaf) in _SCALARS:
        return new
    if _holds_numbers(leaf):
        return _fill(new, leaf, where, at)
    wrapper = wrapper_of(leaf)
    if wrapper is not None:
        inner = wrapper.unwrap(leaf)
        if _holds_numbers(inner):
            if wrapper.rewrap is None:
                raise TypeError(WRAPPED_FILL_MSG.format(where=where(at), what=wrapper.what))
            return wrapper.rewrap(leaf, _fill(new, inner, where, at))
    return new


def _put_new(new: object, leaf: Any, emask: Any, walker: _Run, path: tuple[Any, ...]) -> Any:
    """`new`, computed for `leaf` at `path`, put in its place or into `emask`'s elements."""
    if emask is None:
        return _keep_array(new, leaf, walker.where, path)
    return _masked(emask, new, leaf, lambda: walker.where(path))


@dataclasses.dataclass(slots=True)
class _Pending:
    """A leaf whose new value is being computed on a thread pool (`is_parallel`)."""

    future: concurrent.futures.Future[Any]
    path: tuple[Any, ...]
    finish: Callable[[Any], Any] | None  # applied to the result once it is there


class _Run:
    """One operation over a selection: what the op puts at each spot, and the leaves it
    reaches (`count`: none, and only wrapped values or static fields reached, is an error)."""

    __slots__ = ("tree", "op", "is_leaf", "text", "count", "blocked", "pool", "pending", "traced")

    def __init__(
        self,
        tree: Any,
        op: _Op,
        is_leaf: Callable[[Any], bool] | None,
        text: Callable[[], str],
        pool: concurrent.futures.Executor | None = None,
    ):
        self.tree, self.op, self.is_leaf = tree, op, is_leaf
        self.text = text  # the selection, as `tree.at[...]`
        self.count = 0
        self.blocked: list[tuple[tuple[Any, ...], str, bool]] = []  # spots of wrapped values only
        self.pool, self.pending = pool, False
        # under `is_parallel`, whether the value `set` puts is (or holds) a tracer: looked
        # at once, and refused at the first selected spot
        self.traced = (
            pool is not None
            and type(op) is _Set
            and any(isinstance(leaf, Tracer) for leaf in tree_leaves(op.value))
        )

    def where(self, path: tuple[Any, ...]) -> str:
        return path_str(self.tree, path)

    def run(self, found: Selection) -> Any:
        op = self.op
        out = found.rebuild(self.spot, self.static_spot, fills=op.fills, fill=op.fill_value)
        found.check(self.count, self.blocked)
        return self.resolve(out) if self.pending else out

    def chain(self, matchers: tuple[Matcher, ...]) -> Any:
        """A chain of names and indices (no `is_leaf`) found and rebuilt by the rows alone;
        `_NO_FAST_PATH` for anything else (a missing key: `select` says what, in its words)."""
        node = self.tree
        path: tuple[Any, ...] = ()
        hops: list[tuple[Any, ...]] = []
        for matcher in matchers:
            if not matcher.one_key:
                return _NO_FAST_PATH
            row = row_of(node)
            found = row.child(node, matcher.key)  # type: ignore[attr-defined]
            if found is None:
                return _NO_FAST_PATH
            hops.append((row, node, path, found))
            node, path = found[1], path + (found[0],)
        new = self.op.spot(self, node, path, None)
        if self.count == 0:
            note_blocked(Spot(node, path, None), self.blocked)
            if self.blocked:  # only wrapped values there: the selection's own error
                select(self.tree, matchers, None, self.text).check(0, self.blocked)
        where = self.where
        for row, node, path, (entry, child) in reversed(hops):
            new = node if new is child else row.replace(node, entry, child, new, path, where)
        return new

    def spot(self, s: Spot) -> Any:
        if self.pool is not None:  # traced leaves and values are refused here, for every op
            for p, leaf in tree_flatten_with_path(s.node, is_leaf=self.is_leaf)[0]:
                if isinstance(leaf, Tracer):
                    raise ValueError(
                        PARALLEL_TRACED_MSG.format(what="leaf", where=self.where(s.path + p))
                    )
            if self.traced:
                raise ValueError(
                    PARALLEL_TRACED_MSG.format(what="value set", where=self.where(s.path))
                )
        before = self.count
        out = self.op.spot(self, s.node, s.path, s.emask)
        if self.count == before:
            note_blocked(s, self.blocked)
        return out

    def static_spot(self, s: Any) -> Any:
        """A static field named last, set or applied to: a copy of the node with a new
        layout, the value going through its `on_setattr` callbacks; children shared."""
        old = s.row.static_values(s.node).get(s.name, _MISSING)
        if old is _MISSING:  # declared static, but this instance never set it
            raise LookupError(STATIC_UNSET_MSG.format(where=self.where(s.path), name=s.name))
        self.count += 1
        new = self.op.static_value(self, old, s.path)
        return s.node if new is old else s.row.with_static(s.node, s.name, new)

    def call(
        self,
        fn: Callable[..., Any],
        path: tuple[Any, ...],
        *args: Any,
        finish: Callable[[Any], Any] | None = None,
    ) -> Any:
        """`fn(*args)` for the leaf at `path` (then `finish` of it), errors naming the path;
        under `is_parallel`, a `_Pending` stands in for it until `resolve`."""
        if self.pool is None:
            result = self.call_now(fn, path, *args)
            return result if finish is None else finish(result)
        self.pending = True
        return _Pending(self.pool.submit(fn, *args), path, finish)

    def call_now(self, fn: Callable[..., Any], path: tuple[Any, ...], *args: Any) -> Any:
        """`fn(*args)` here and now, an error it raises noted with the leaf at `path`."""
        try:
            return fn(*args)
        except Exception as error:
            _note_fn(error, fn, self.where(path), self.text())
            raise

    def map_leaves(self, fn: Callable[[Any], Any], node: Any, path: tuple[Any, ...]) -> Any:
        """`fn` over the leaves of a selected subtree, here and now, counting them."""
        leaves, treedef = jax.tree_util.tree_flatten(node, is_leaf=self.is_leaf)
        self.count += len(leaves)
        out: list[Any] = []

        def failed_path() -> tuple[Any, ...]:
            return path + tree_flatten_with_path(node, is_leaf=self.is_leaf)[0][len(out)][0]

        try:
            for leaf in leaves:
                new = fn(leaf)
                if type(new) in _FILLS:
                    new = _keep_array(new, leaf, lambda _: self.where(failed_path()), None)
                out.append(new)
        except Exception as error:
            _note_fn(error, fn, self.where(failed_path()), self.text())
            raise
        return treedef.unflatten(out)

    def resolve(self, tree: Any) -> Any:
        """Replace the pending results of `is_parallel` by their values, in order."""

        def value(x: Any) -> Any:
            if type(x) is not _Pending:
                return x
            try:
                result = x.future.result()
            except Exception as error:
                where, selection = self.where(x.path), self.text()
                add_leaf_note(error, f"raised at {where} (in {selection}, run with is_parallel)")
                raise
            return result if x.finish is None else x.finish(result)

        return jax.tree_util.tree_map(value, tree, is_leaf=lambda x: type(x) is _Pending)


class _Op:
    """What happens at each selected node (a *spot*), given its element mask (or `None`)."""

    __slots__ = ()
    fills = False  # whether unselected leaves are replaced (only `get`)
    fill_value: Any = None
    edits_static = False  # whether a static field named last is set (`set`, `apply`)

    def spot(self, walker: _Run, node: object, path: tuple, emask: ArrayLike | None) -> Any:
        raise NotImplementedError

    def static_value(self, walker: _Run, old: object, path: tuple) -> Any:
        """The new value of a static field (only for ops with `edits_static`)."""
        raise NotImplementedError


class _Get(_Op):
    __slots__ = ("fill_value",)
    fills = True
    traced_msg = TRACED_MASK_GET_MSG

    def __init__(self, fill_value: object) -> None:
        self.fill_value = fill_value

    def spot(self, walker, node, path, emask):
        if emask is None:
            is_leaf = walker.is_leaf
            walker.count += 1 if is_leaf_node(node, is_leaf) else len(tree_leaves(node, is_leaf))
            return node
        fill, traced_msg = self.fill_value, self.traced_msg

        def take(x: object, where: tuple) -> Any:
            return _take(x, emask, fill, lambda: walker.where(where), traced_msg)

        return _map_with_paths(walker, take, node, path)


def _map_with_paths(walker: _Run, fn: Callable[..., Any], node: object, path: tuple) -> Any:
    """`fn(leaf, key_path)` over the leaves of a selected subtree, counting them."""
    if is_leaf_node(node, walker.is_leaf):
        walker.count += 1
        return fn(node, path)
    pairs, treedef = tree_flatten_with_path(node, is_leaf=walker.is_leaf)
    walker.count += len(pairs)
    return treedef.unflatten([fn(x, path + p) for p, x in pairs])


class _Set(_Op):
    """Put `value` at the selection: a leaf at every selected leaf, a tree fitting the
    selected subtree or the whole tree leaf by leaf, anything else whole at each spot."""

    __slots__ = ("value", "mode")

    BROADCAST, ROOT, SPOT = range(3)
    edits_static = True

    def static_value(self, walker, old, path):
        return self.value  # a configuration value is put whole, whatever its structure

    def __init__(self, value: Any, root: Any, is_leaf: Any) -> None:
        self.value = value
        if value is None or is_leaf_node(value, is_leaf):
            self.mode = self.BROADCAST
        else:
            structure = functools.partial(tree_structure, is_leaf=is_leaf)
            self.mode = self.ROOT if structure(value) == structure(root) else self.SPOT

    def spot(self, walker, node, path, emask):
        value = self.value
        if self.mode == self.BROADCAST:
            return self._put(walker, value, node, path, emask)
        if self.mode == self.SPOT:  # a tree of the subtree's structure first, then the root's
            fitted = self._pairwise(walker, node, value, emask, path)
            if fitted is not _MISSING:
                return fitted
        whole = self._navigate(walker, value, path)
        if whole is not _MISSING:
            fitted = self._pairwise(walker, node, whole, emask, path)
            if fitted is not _MISSING:
                return fitted
        # fits neither: the value goes whole where the selection points
        walker.count += max(1, len(tree_leaves(node, is_leaf=walker.is_leaf)))
        if emask is not None:
            return _masked(emask, value, node, lambda: walker.where(path))
        return value

    def _put(self, walker, value, node, path, emask):
        if emask is None:  # no function to run: the value at every leaf
            if is_leaf_node(node, walker.is_leaf):
                walker.count += 1
                if type(value) in _FILLS:
                    return _keep_array(value, node, walker.where, path)
                return value
            if type(value) in _FILLS:  # arrays below are filled, other leaves replaced
                return walker.map_leaves(lambda _: value, node, path)
            treedef = tree_structure(node, is_leaf=walker.is_leaf)
            walker.count += treedef.num_leaves
            return treedef.unflatten([value] * treedef.num_leaves)

        def put(x: object, where: tuple) -> Any:
            return _masked(emask, value, x, lambda: walker.where(where))

        return _map_with_paths(walker, put, node, path)

    def _navigate(self, walker, value, path):
        for entry in path:
            if is_leaf_node(value, walker.is_leaf):
                return value  # a prefix of the whole tree: this leaf covers the subtree
            found = row_of(value).child(value, entry_name(entry))
            if found is None or found[0] != entry:
                return _MISSING
            value = found[1]
        return value

    def _pairwise(self, walker, node, value, emask, path):
        """`value` (a prefix of `node`) put leaf by leaf, or `_MISSING` if it does not fit."""
        if value is None or is_leaf_node(value, walker.is_leaf):
            return self._put(walker, value, node, path, emask)
        try:  # the fit first: a value that does not fit (every spot, maybe) is not flattened
            subtrees = tree_structure(value, is_leaf=walker.is_leaf).flatten_up_to(node)
        except (ValueError, TypeError):
            return _MISSING
        pairs, treedef = tree_flatten_with_path(value, is_leaf=walker.is_leaf)
        out = [
            self._put(walker, v, sub, path + p, emask)
            for (p, v), sub in zip(pairs, subtrees, strict=True)
        ]
        return treedef.unflatten(out)


class _Apply(_Op):
    __slots__ = ("fn",)
    edits_static = True

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def static_value(self, walker, old, path):
        # here and now, even under `is_parallel`: the value goes into the node's layout,
        # where no pending result would be resolved
        return walker.call_now(self.fn, path, old)

    def spot(self, walker, node, path, emask):
        fn = self.fn
        if emask is None and walker.pool is None:
            if is_leaf_node(node, walker.is_leaf):
                # the common spot (a name chain ending at a leaf), without a frame to spare
                walker.count += 1
                try:
                    new = fn(node)
                except Exception as error:
                    _note_fn(error, fn, walker.where(path), walker.text())
                    raise
                return _keep_array(new, node, walker.where, path) if type(new) in _FILLS else new
            return walker.map_leaves(fn, node, path)

        def one(x: object, where: tuple) -> Any:
            def finish(new: object) -> Any:
                return _put_new(new, x, emask, walker, where)

            return walker.call(fn, where, x, finish=finish)

        return _map_with_paths(walker, one, node, path)


class _ApplyWhole(_Apply):
    """`apply(fn, whole=True)`: `fn` of each selected node, not of its leaves."""

    __slots__ = ()

    def spot(self, walker, node, path, emask):
        if emask is not None:
            raise ValueError(WHOLE_ELEMENT_MASK_MSG.format(where=walker.where(path)))
        walker.count += 1
        return walker.call(self.fn, path, node)


class _Reduce(_Op):
    """Fold `fn(accumulator, leaf)` over the selected leaves (`_MISSING`: none yet)."""

    __slots__ = ("fn", "accumulator")

    def __init__(self, fn: Callable[[Any, Any], Any], initializer: object) -> None:
        self.fn, self.accumulator = fn, initializer

    def spot(self, walker, node, path, emask):
        def fold(x: object, where: tuple) -> None:
            if emask is not None:
                at = functools.partial(walker.where, where)
                x = _take(x, emask, None, at, TRACED_MASK_REDUCE_MSG)
            if self.accumulator is _MISSING:
                self.accumulator = x
            else:
                try:  # here, without a frame to spare (`call_now`'s work)
                    self.accumulator = self.fn(self.accumulator, x)
                except Exception as error:
                    _note_fn(error, self.fn, walker.where(where), walker.text())
                    raise

        _map_with_paths(walker, fold, node, path)
        return node


class _Pluck(_Get):
    """Keep the selected subtrees as `get` takes them (no fill), in flatten order, up to `limit`."""

    __slots__ = ("found", "limit")
    fills = False
    traced_msg = TRACED_MASK_PLUCK_MSG

    def __init__(self, limit: float) -> None:
        super().__init__(None)
        self.found: list[Any] = []
        self.limit = limit

    def spot(self, walker, node, path, emask):
        picked = super().spot(walker, node, path, emask)
        if len(self.found) < self.limit:
            self.found.append(picked)
        return node


class _Scan(_Op):
    __slots__ = ("fn", "state")

    def __init__(self, fn: Callable[[Any, Any], tuple[Any, Any]], state: Any) -> None:
        self.fn, self.state = fn, state

    def spot(self, walker, node, path, emask):
        def one(x: object, where: tuple) -> Any:
            result = walker.call(self.fn, where, x, self.state)
            if not (isinstance(result, tuple) and len(result) == 2):
                value = describe(result)
                raise TypeError(SCAN_RESULT_MSG.format(where=walker.where(where), value=value))
            new, self.state = result
            return _put_new(new, x, emask, walker, where)

        return _map_with_paths(walker, one, node, path)


class _Call(_Op):
    """A method of the selected node, run on a copy of it that replaces it (`__call__`)."""

    __slots__ = ("name", "args", "kwargs", "value")

    def __init__(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.name, self.args, self.kwargs = name, args, kwargs

    def spot(self, walker, node, path, emask):
        walker.count += 1  # a wrapped value's methods run too

        def run(copy: object) -> Any:
            return method_of(walker.tree, copy, path, self.name)(*self.args, **self.kwargs)

        self.value, new = call_on_copy(node, run)
        return new


_NO_FAST_PATH = object()


def _aligned_mask_op(tree: Any, mask: Any, op: _Op, selection: Callable[[], str]) -> Any:
    """`tree.at[mask].set/apply` for a mask of exactly the tree's structure (`tree > 0`),
    read leaf by leaf (`aligned_mask`); `_NO_FAST_PATH` for anything else, for the walk."""
    if type(op) is _Apply:
        fn = op.fn
    elif type(op) is _Set and op.mode == _Set.BROADCAST:
        value = op.value
        fn = None
    else:
        return _NO_FAST_PATH
    found = aligned_mask(tree, mask)
    if found is None:
        return _NO_FAST_PATH
    leaves, treedef, flags, spots = found
    out = []
    where = functools.partial(leaf_path_str, tree)
    # a number is fitted to a dtype once: the same number (the value set) into the next leaf
    # of that dtype reuses it
    fitted: tuple[Any, Any, Any] = (_NO_FAST_PATH, None, None)  # (number, dtype, fit)
    new: Any = value if fn is None else None
    for index, (leaf, flag, spot) in enumerate(zip(leaves, flags, spots)):
        if spot is False:
            out.append(leaf)
            continue
        if fn is not None:
            try:
                new = fn(leaf)
            except Exception as error:
                _note_fn(error, fn, where(index), selection())
                raise
        if spot is True:
            out.append(_keep_array(new, leaf, where, index) if type(new) in _FILLS else new)
        elif spot is None or type(leaf) is np.ndarray:  # 0-d mask, or NumPy's `where`
            out.append(_masked(flag, new, leaf, functools.partial(where, index)))
        elif type(new) in NUMBER_TYPES and type(leaf) in ARRAY_CLASSES:
            # the common case (`.at[x > 0].set(0.0)`): a weak number keeps the leaf's dtype
            dtype = leaf.dtype
            if new is not fitted[0] or dtype is not fitted[1]:
                fitted = (new, dtype, _number_fit(new, leaf, functools.partial(where, index)))
            out.append(jnp.where(flag, fitted[2], leaf))
        elif isinstance(new, (jax.Array, np.ndarray)) and new.shape == spot:
            out.append(jnp.where(flag, new, leaf))  # shapes already fit
        else:
            out.append(_masked(flag, new, leaf, functools.partial(where, index)))
    return jax.tree_util.tree_unflatten(treedef, out)


class AtIndexer(Generic[T]):
    """Select parts of a pytree with `[...]`, then get, set, apply, reduce or scan them.

    `tree.at[...]` on a `TreeClass`, `tc.at(tree)[...]` on any pytree. Each `[...]` is one
    level of the key path, applied to each node the levels before it selected
    (`model.at[Linear]["weight"]`); a tuple is a union at one level. Every operation
    returns a new tree and leaves the input untouched, even when it raises. The `.at`
    guide shows every selector and operation at work. **Selectors**:

    - `"name"`, `0`, `-1`, `1:3`, `...`: an attribute or dict key, a sequence index or
      slice (a `tc.Stacked` is indexed by block), every child (alone: the whole tree);
    - `re.compile(p)`: children whose name fully matches `p`; `tc.glob("layers.*.weight")`:
      nodes whose key path below matches the pattern;
    - a boolean mask: a tree of the (selected) node's structure or a prefix of it holding
      bools (whole leaves or subtrees) or bool arrays of a leaf's shape (its elements:
      `jnp.where` for `set`/`apply`/`scan`, `leaf[mask]` for `get`/`reduce`); a tuple of
      only bools and masks is one mask, not a union;
    - a class (`Linear`, `jax.Array`): every node below that is an instance of it, not
      looking inside a match; `tc.where(fn)`: every node below where `fn(path, node)`;
    - a `tc.BaseKey`, a value of a type registered with `tc.BaseKey.def_alias` or
      `tc.at.def_rule`, or a JAX key entry: children whose key entry it equals.

    A missing name or index, and a glob, regex or `BaseKey` that selects nothing, raise
    `LookupError` naming the closest keys; a mask or predicate selecting nothing is an
    empty selection. **Operations**, each on its method: `.get`, `.set`, `.apply`,
    `.reduce`, `.scan`, `.pluck`, `.mask`, `.paths`, `tree.at["method"](*args, **kwargs)`.

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    tree = {"a": jnp.array([-1.0, 2.0]), "b": {"c": 3.0}}
    assert tc.at(tree)["b"]["c"].set(30.0)["b"]["c"] == 30.0 and tree["b"]["c"] == 3.0
    assert tc.at(tree)[{"a": tree["a"] > 0, "b": False}].set(0.0)["a"].tolist() == [-1, 0]
    ```
    """

    __slots__ = ("tree", "where", "_matchers")

    tree: T
    where: tuple[Any, ...]
    _matchers: tuple[Matcher, ...]

    def __init__(self, tree: T, where: Sequence[Any] | None = ()) -> None:
        if where is None:
            where = ()
        elif not isinstance(where, (tuple, list)):
            raise TypeError(WHERE_TYPE_MSG.format(value=_short_repr(where)))
        self.tree, self.where = tree, tuple(where)
        self._matchers = tuple(
            compile_selector(s, functools.partial(_selection_str, tree, self.where[: i + 1]))
            for i, s in enumerate(self.where)
        )

    def __getitem__(self, selector: object) -> AtIndexer[T]:
        new = object.__new__(AtIndexer)
        new.tree = self.tree
        new.where = self.where + (selector,)
        if type(selector) is str:  # the common case, without building an error context
            matcher: Matcher = NameMatcher(selector)
        elif type(selector) is int:
            matcher = IndexMatcher(selector)
        else:
            matcher = compile_selector(selector, lambda: _selection_str(new.tree, new.where))
        new._matchers = self._matchers + (matcher,)
        return new

    def __iter__(self):
        raise TypeError(ITERATION_MSG)

    def __repr__(self) -> str:
        return f"AtIndexer({_selection_str(self.tree, self.where)})"

    def _selection(self) -> str:
        return _selection_str(self.tree, self.where)

    def _select(
        self, is_leaf: Callable[[Any], bool] | None = None, op: _Op | None = None
    ) -> Selection:
        """The selection as a value: what `self.where` reaches (for `op`: a static field
        named last for `set`/`apply`, opened nodes for `get`)."""
        statics, opens = (False, False) if op is None else (op.edits_static, op.fills)
        return select(self.tree, self._matchers, is_leaf, self._selection, statics, opens)

    def _run(
        self, op: _Op, is_leaf: Callable[[Any], bool] | None, is_parallel: object = False
    ) -> Any:
        if is_parallel is not False and is_parallel is not None:
            if is_parallel is not True and not isinstance(is_parallel, dict):
                raise TypeError(PARALLEL_ARG_MSG.format(value=is_parallel))
            pool_args = {} if is_parallel is True else is_parallel
            with concurrent.futures.ThreadPoolExecutor(**pool_args) as pool:
                run = _Run(self.tree, op, is_leaf, self._selection, pool)
                return run.run(self._select(is_leaf, op))
        matchers = self._matchers
        run = _Run(self.tree, op, is_leaf, self._selection)
        if is_leaf is None:
            if not op.fills:
                out = run.chain(matchers)
                if out is not _NO_FAST_PATH:
                    return out
            if len(matchers) == 1 and type(matchers[0]) is MaskMatcher:
                out = _aligned_mask_op(self.tree, matchers[0].mask, op, self._selection)
                if out is not _NO_FAST_PATH:
                    return out
        return run.run(
            select(self.tree, matchers, is_leaf, self._selection, op.edits_static, op.fills)
        )

    def mask(self, *, is_leaf: Callable[[Any], bool] | None = None) -> Any:
        """The selection as a boolean tree of the input's structure: `True` at every leaf it
        selects, else `False`; `tree.at[mask]` selects the same leaves again. Nodes without
        children (frozen values) stay as they are; a leaf selected in part gets a bool
        array (its element mask, or one flag per block of a `tc.Stacked`).

        **Arguments**

        - `is_leaf`: treat nodes for which it returns `True` as leaves
          (`is_leaf=tc.is_frozen` gives frozen values a flag of their own).

        **Returns**

        A tree of the input's structure with `bool` (or bool array) leaves.

        ```python
        import treeclass as tc

        tree = {"a": 1.0, "b": {"c": 2.0, "d": tc.freeze(1)}}
        assert tc.at(tree)["b"]["c"].mask() == {"a": False, "b": {"c": True, "d": tc.freeze(1)}}
        ```
        """
        check_callable(is_leaf, "AtIndexer.mask", "is_leaf", optional=True)
        return self._select(is_leaf).mask()

    def paths(self, *, is_leaf: Callable[[Any], bool] | None = None) -> list[tuple[Any, ...]]:
        """The key paths of the leaves the selection reaches (in whole or in part), in
        flatten order, as `jax.tree_util.tree_flatten_with_path` gives them.

        **Arguments**

        - `is_leaf`: treat nodes for which it returns `True` as leaves.

        **Returns**

        A list of key paths (tuples of JAX key entries).

        ```python
        import jax
        import treeclass as tc

        paths = tc.at({"a": 1.0, "b": {"c": 2.0, "d": 3.0}})["b"][...].paths()
        assert [jax.tree_util.keystr(p) for p in paths] == ["['b']['c']", "['b']['d']"]
        ```
        """
        check_callable(is_leaf, "AtIndexer.paths", "is_leaf", optional=True)
        return self._select(is_leaf).paths()

    def get(
        self,
        fill_value: object = None,
        *,
        is_leaf: Callable[[Any], bool] | None = None,
        is_parallel: bool | dict[str, Any] = False,
    ) -> T:
        """The tree with unselected leaves replaced by `fill_value`.

        **Arguments**

        - `fill_value`: what unselected leaves become (`None` by default). Under an
          element mask, `None` gives `leaf[mask]`, any other value
          `jnp.where(mask, leaf, fill_value)` (which also works with traced masks).
        - `is_leaf`: treat nodes for which it returns `True` as leaves.
        - `is_parallel`: as for `apply` (same result; a traced leaf raises `ValueError`).

        **Returns**

        A tree of the input's structure.

        ```python
        import treeclass as tc

        assert tc.at({"a": 1, "b": 2})["a"].get() == {"a": 1, "b": None}
        ```
        """
        check_callable(is_leaf, "AtIndexer.get", "is_leaf", optional=True)
        return self._run(_Get(fill_value), is_leaf, is_parallel)

    def set(
        self,
        value: object,
        *,
        is_leaf: Callable[[Any], bool] | None = None,
        is_parallel: bool | dict[str, Any] = False,
    ) -> T:
        """The tree with the selection replaced by `value`.

        **Arguments**

        - `value`: a leaf, put at every selected leaf; a tree of each selected subtree's
          structure (or a prefix of it, broadcast); or a tree of the whole tree's
          structure, read where selected; anything else is put whole at each selected spot.
          Under an element mask: `jnp.where(mask, value, leaf)`. A number at an array leaf
          becomes an array of the leaf's shape, dtype and type (`True`/`False` are flags,
          put as they are); one that would change on the way in (`2.7` into an integer
          array) raises `TypeError` / `OverflowError` naming the leaf: the `.at` guide's
          "Numbers at array leaves" has the whole rule.
        - `is_leaf`: treat nodes for which it returns `True` as leaves.
        - `is_parallel`: as for `apply` (same result; a traced leaf or value raises `ValueError`).

        **Returns**

        The new tree.

        ```python
        import treeclass as tc

        assert tc.at({"a": 1, "b": 2})["a"].set(10) == {"a": 10, "b": 2}
        ```
        """
        check_callable(is_leaf, "AtIndexer.set", "is_leaf", optional=True)
        return self._run(_Set(value, self.tree, is_leaf), is_leaf, is_parallel)

    def apply(
        self,
        fn: Callable[[Any], Any],
        *,
        whole: bool = False,
        is_leaf: Callable[[Any], bool] | None = None,
        is_parallel: bool | dict[str, Any] = False,
    ) -> T:
        """The tree with `fn` applied to every selected leaf (or, `whole=True`, node).

        **Arguments**

        - `fn`: a function of one leaf (under an element mask,
          `jnp.where(mask, fn(leaf), leaf)`; a number returned for an array leaf fills it
          as for `set`); an error it raises gets a note naming the leaf's key path.
        - `whole`: call `fn` on each selected node, whole (a frozen value as it is), and
          put what it returns in its place, as it is (model surgery).
        - `is_leaf`: treat nodes for which it returns `True` as leaves.
        - `is_parallel`: `True`, or a dict of `concurrent.futures.ThreadPoolExecutor`
          arguments (`{"max_workers": 8}`): run `fn` on a thread pool, one call per leaf,
          with the same result (for I/O or GIL-releasing functions); a traced leaf (inside
          `jax.jit`/`vmap`/`grad`) raises `ValueError`.

        **Returns**

        The new tree.

        ```python
        import treeclass as tc

        assert tc.at({"a": 1, "b": 2})["b"].apply(lambda x: x * 10) == {"a": 1, "b": 20}
        ```
        """
        check_callable(fn, "AtIndexer.apply", "fn", " of one leaf" if not whole else " of one node")
        check_callable(is_leaf, "AtIndexer.apply", "is_leaf", optional=True)
        if not isinstance(whole, bool):
            raise TypeError(WHOLE_TYPE_MSG.format(value=whole))
        return self._run((_ApplyWhole if whole else _Apply)(fn), is_leaf, is_parallel)

    @overload
    def reduce(
        self,
        fn: Callable[[_A | _R, Any], _R],
        *,
        initializer: _A,
        is_leaf: Callable[[Any], bool] | None = None,
    ) -> _A | _R: ...
    @overload
    def reduce(
        self, fn: Callable[[Any, Any], _R], *, is_leaf: Callable[[Any], bool] | None = None
    ) -> _R: ...
    def reduce(
        self,
        fn: Callable[[Any, Any], Any],
        *,
        initializer: object = _MISSING,
        is_leaf: Callable[[Any], bool] | None = None,
    ) -> Any:
        """Fold `fn(accumulator, leaf)` over the selected leaves, in flatten order.

        **Arguments**

        - `fn`: a function of the accumulator and one leaf; an error it raises gets a
          note naming the leaf's key path.
        - `initializer`: the first accumulator; without it the first selected leaf is.
        - `is_leaf`: treat nodes for which it returns `True` as leaves.

        **Returns**

        The final accumulator.

        ```python
        import treeclass as tc

        assert tc.at({"a": 1, "b": 2, "c": 3})["a", "c"].reduce(lambda acc, x: acc + x) == 4
        ```
        """
        check_callable(fn, "AtIndexer.reduce", "fn", " of (accumulator, leaf)")
        check_callable(is_leaf, "AtIndexer.reduce", "is_leaf", optional=True)
        fold = _Reduce(fn, initializer)
        self._run(fold, is_leaf)
        if fold.accumulator is _MISSING:
            raise TypeError(EMPTY_REDUCE_MSG.format(selection=self._selection()))
        return fold.accumulator

    def scan(
        self,
        fn: Callable[[Any, _S], tuple[Any, _S]],
        state: _S,
        *,
        is_leaf: Callable[[Any], bool] | None = None,
    ) -> tuple[T, _S]:
        """Apply `fn` to the selected leaves in flatten order, threading a state.

        **Arguments**

        - `fn`: `(leaf, state) -> (new_leaf, new_state)` (a number as `new_leaf` for an
          array leaf fills it, as for `set`); an error it raises gets a note naming the leaf.
        - `state`: the initial state.
        - `is_leaf`: treat nodes for which it returns `True` as leaves.

        **Returns**

        `(new_tree, final_state)`.

        ```python
        import treeclass as tc

        tree, count = tc.at({"a": 1, "b": 2})[...].scan(lambda x, n: (x * 10, n + 1), 0)
        assert tree == {"a": 10, "b": 20} and count == 2
        ```
        """
        check_callable(fn, "AtIndexer.scan", "fn", " of (leaf, state)")
        check_callable(is_leaf, "AtIndexer.scan", "is_leaf", optional=True)
        scan = _Scan(fn, state)
        tree = self._run(scan, is_leaf)
        return tree, scan.state

    def pluck(
        self,
        count: int | None = None,
        *,
        is_leaf: Callable[[Any], bool] | None = None,
        is_parallel: bool | dict[str, Any] = False,
    ) -> list[Any]:
        """The selected subtrees themselves (under an element mask, `leaf[mask]`), in
        flatten order, where `get` returns the whole tree.

        **Arguments**

        - `count`: at most this many subtrees, the first ones (`None`: all).
        - `is_leaf`: treat nodes for which it returns `True` as leaves.
        - `is_parallel`: accepted as for `get`.

        **Returns**

        A list of the selected subtrees.

        ```python
        import treeclass as tc

        assert tc.at({"a": 1, "b": [2, 3]})[...].pluck() == [1, [2, 3]]
        ```
        """
        if count is not None and (
            isinstance(count, bool) or not isinstance(count, int) or count < 0
        ):
            raise TypeError(PLUCK_COUNT_MSG.format(value=count))
        check_callable(is_leaf, "AtIndexer.pluck", "is_leaf", optional=True)
        pluck = _Pluck(math.inf if count is None else count)
        self._run(pluck, is_leaf, is_parallel)  # refuses traced leaves, as `get` does
        return pluck.found

    def_rule = staticmethod(def_rule)

    def __call__(self, *args: object, **kwargs: object) -> tuple[Any, T]:
        """Call a method on a mutable copy: `tree.at["method"](*a, **k)` -> `(value, new_tree)`.

        The method may set, delete or add attributes of its node's copy (NumPy leaves are
        copied too), immutable again once it returns or raises; the input is untouched.
        Names and indices before the method's name reach a nested node.

        ```python
        import treeclass as tc

        class Counter(tc.TreeClass):
            count: int = 0

            def increment(self, by):
                self.count += by
                return self.count

        assert Counter().at["increment"](2) == (2, Counter(count=2))
        ```
        """
        where = self.where
        if not where or type(where[-1]) is not str or any(type(s) not in (str, int) for s in where):
            raise TypeError(CALL_NEEDS_NAME_MSG.format(selection=self._selection()))
        call = _Call(where[-1], args, kwargs)
        run, head = _Run(self.tree, call, None, self._selection), self._matchers[:-1]
        tree = run.chain(head)
        if tree is _NO_FAST_PATH:  # a missing name or index: the walker says which
            tree = run.run(select(self.tree, head, None, self._selection))
        return call.value, tree


def selection(indexer: AtIndexer[Any], is_leaf: Callable[[Any], bool] | None = None) -> Selection:
    """The selection `indexer` makes, as a value (`_selection.Selection`): its `flags()`,
    `paths()` and `mask()` are what `tc.optim`, the sharding rules and `tc.load(where=)` read."""
    return indexer._select(is_leaf)


def at(tree: T, where: Sequence[Any] | None = ()) -> AtIndexer[T]:
    """The `.at[...]` indexer of any pytree: `tc.at(tree)[...]`; see `AtIndexer`.

    **Arguments**

    - `tree`: any pytree (a `TreeClass` also has the `tree.at` property).
    - `where`: selectors to start with, one per level (sepes's form):
      `tc.at(tree, where=["a", 0])` is `tc.at(tree)["a"][0]`.

    **Returns**

    An `AtIndexer` (`tc.at.def_rule(kind, compare)` makes values of type `kind` selectors).

    ```python
    import treeclass as tc

    assert tc.at({"a": [1, 2]})["a"][-1].set(5) == {"a": [1, 5]}
    ```
    """
    return AtIndexer(tree, where)


at.def_rule = def_rule  # type: ignore[attr-defined]  # sepes's spelling: `tc.at.def_rule(...)`
