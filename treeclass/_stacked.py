"""Stacked blocks: N blocks of one structure kept as one tree whose arrays carry a block axis.

JAX sees the block tree's children (one `f32[N, ...]` leaf per array), `.at` the N blocks
(the row `StackedKind`), the printers `Stacked[N×Block]`. Arrays (wrapped ones too, when
their wrapper can wrap again) carry the block axis; other values are shared by all blocks.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from jax.tree_util import SequenceKey, keystr

from ._at import AtIndexer, at
from ._fields import gradients_stopped, stop_gradient_if_traced
from ._frozen import FROZEN_FIELD_FIX
from ._numbers import (
    KIND_FITS,
    NumberRangeError,
    dtype_kind,
    dtype_name,
    is_number,
    jax_holdable,
    number_misfit,
    number_value,
)
from ._pprint import array_repr, tree_str
from ._pprint_html import Printed
from ._pprint_registry import register_printer
from ._roles import FROZEN, leaf_roles
from ._structure import (
    Display,
    NodeKind,
    Opened,
    Stack,
    Wrapper,
    describe,
    first_mismatch,
    is_leaf_node,
    is_wrapper,
    node_kind,
    open_node,
    rebuild,
    register_kind,
    root_name,
    stack_of,
    wrapper_of,
)
from ._util import check_callable
from ._values import array_type, exact_key, is_array

_T = TypeVar("_T")

# How a leaf of the block tree is kept (`_FROZEN_ARRAY`: in a wrapper that can wrap again).
_ARRAY, _FROZEN_ARRAY, _SHARED = range(3)

# -- messages ---------------------------------------------------------------------------------

EMPTY_MSG = "A stack needs at least one block; `Stacked.from_blocks` got an empty sequence."
FROM_INIT_EMPTY_MSG = (
    "A stack needs at least one block; `Stacked.from_init` got keys for none ({what}). "
    "Pass one key per block: `jax.random.split(key, n)` with n >= 1."
)
NOT_A_NODE_MSG = (
    "A block must be a tree with children (a TreeClass, a dict, a tuple, ...), got {what}. "
    "A stack of plain arrays is an array: `jnp.stack(arrays)`."
)
STRUCTURE_MSG = (
    "Block {k} does not have block 0's structure at {where}: {reason}. Every block of a "
    "stack has one structure: the same fields and static values, and the same leaves "
    "frozen."
)
SHAPE_MSG = (
    "Block {k}'s array at {where} is {got}, block 0's is {want}: the arrays of a stack have "
    "one shape and dtype in every block."
)
SHARED_MSG = (
    "Block {k}'s value at {where} is {got}, block 0's is {want}: values that are not arrays "
    "are shared by all blocks of a stack, so they must be equal. Make it an array to give "
    "each block its own (`jnp.asarray(value)`), or a static field if it is configuration."
)
FROZEN_SUBTREE_MSG = (
    "Block {k}'s value at {where} is {got}, block 0's is {want}: a frozen subtree is one "
    "value shared by all blocks of a stack, so it must be equal in every block; its "
    "arrays cannot carry the block axis. For pretrained weights in each block (a LoRA "
    "adapter's base layer), keep them ordinary leaves in a field declared frozen: they "
    "are stacked like any leaf and never trained:\n" + FROZEN_FIELD_FIX
)
MIXED_MSG = (
    "Block {k}'s value at {where} is {got}, block 0's is {want}: a leaf of a stack is an "
    "array in every block (one slice each), or one value shared by all blocks."
)
LEADING_AXIS_MSG = (
    "The array at {where} is {got}: every array of a stack carries the block axis first, "
    "of length {n} here{source}."
)
NO_LENGTH_MSG = (
    "`Stacked(tree)` finds the number of blocks from the arrays' leading axis, but the tree "
    "has no arrays: pass it, `Stacked(tree, length=n)`."
)
INDEX_MSG = "Block index {index} out of range for a stack of {n} blocks (valid: {low} to {high})."
INDEX_TYPE_MSG = "A stack is indexed by an int or a slice, got {what}."
EMPTY_SLICE_MSG = "The slice [{text}] selects no block of a stack of {n}; a stack is never empty."
WRITE_MSG = (
    "Cannot put {got} into block {k} of the stacked leaf at {where}: each block of a stacked "
    "leaf is one slice of an array {stacked}, so a block takes an array of shape "
    "{block_shape} and dtype {dtype}, or a number of that kind.{hint}"
)
WRITE_HINT = (
    " To give blocks different settings for one leaf (optimizer settings per block: "
    "freeze blocks 0-5, a learning rate per block), build the values on a tree of "
    "numbers, not on a selection of the model:\n"
    "    factors = model.at[...].set(1.0).at['blocks'][0:6].set(0.0)\n"
    "    opt = optax.chain(optax.adam(1e-3), tc.optim.scale_blocks(factors))"
)
RANGE_MSG = (
    "Cannot put {got} into block {k} of the stacked leaf at {where}: {reason}, so the "
    "number would not be kept. Give a number that {dtype} holds, or convert it on purpose "
    "first: `jnp.asarray(value).astype(jnp.{dtype})`."
)
FROZEN_SOME_MSG = (
    "The leaf at {where} is frozen in block {frozen} but not in block {plain}: a leaf of a "
    "stack is frozen in every block or in none. Freeze it in all blocks: select every "
    "block with `...` (`model.at['blocks'][...][...].apply(tc.freeze)`)."
)
SCAN_RESULT_MSG = (
    "The function given to `{method}` must return a pair `(carry, output)` (use `None` for "
    "no output), got {what} from {where}."
)
RESTACK_MSG = (
    "`tc.restack` cannot convert {where}: the tree has {got}, the template has {want}. It "
    "converts between a `Stacked` and a tuple or list of as many blocks, and needs the "
    "rest of the two trees to agree."
)


def scan_result(out: Any, method: str, where: str) -> tuple[Any, Any]:
    """`out`, checked to be the `(carry, output)` pair a scanned function returns."""
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(SCAN_RESULT_MSG.format(method=method, what=describe(out), where=where))
    return out


# -- leaves -----------------------------------------------------------------------------------


def _is_array(x: object) -> bool:
    """A JAX or NumPy array, or an abstract one."""
    return is_array(x) or isinstance(x, jax.ShapeDtypeStruct)


def _has_axis(x: Any, n: int) -> bool:
    shape = x.shape
    return len(shape) >= 1 and shape[0] == n


def _holder(x: object) -> Wrapper[Any, Any] | None:
    """The wrapper part of a leaf a stack may slice and wrap again (it has a `rewrap`)."""
    wrapper = wrapper_of(x)
    return None if wrapper is None or wrapper.rewrap is None else wrapper


def _unfrozen(x: Any) -> Any:
    wrapper = _holder(x)
    return x if wrapper is None else wrapper.unwrap(x)


def _rewrap(old: Any, value: object) -> Any:
    rewrap = wrapper_of(old).rewrap  # type: ignore[union-attr]
    return rewrap(old, value)  # type: ignore[misc]


def _leaf_kind(x: object, n: int) -> int:
    """How a leaf is kept; an array without the block axis (`jax.tree.map(jnp.sum, stack)`
    makes them) is shared."""
    if _is_array(x):
        return _ARRAY if _has_axis(x, n) else _SHARED
    wrapper = _holder(x)
    if wrapper is not None:
        inner = wrapper.unwrap(x)
        if _is_array(inner) and _has_axis(inner, n):
            return _FROZEN_ARRAY
    return _SHARED


def _index(x: Any, i: Any) -> Any:
    if isinstance(x, jax.ShapeDtypeStruct):
        shape = x.shape[1:] if isinstance(i, int) else (len(range(x.shape[0])[i]), *x.shape[1:])
        return jax.ShapeDtypeStruct(shape, x.dtype)
    if isinstance(i, int) and isinstance(x, jax.Array):  # one slice, not a gather
        return jax.lax.index_in_dim(x, i, keepdims=False)
    return x[i, ...]  # with `...`: a 0-d NumPy array, not a NumPy scalar


def _take(x: object, kind: int, i: object) -> Any:
    """Block `i` (an int) or blocks `i` (a slice) of one leaf."""
    if kind == _ARRAY:
        return _index(x, i)
    if kind == _FROZEN_ARRAY:
        return _rewrap(x, _index(_unfrozen(x), i))
    return x


def _split(x: Any, kind: int, n: int) -> list[Any]:
    """One leaf's value in each of the `n` blocks."""
    if kind == _SHARED:
        return [x] * n
    inner = x if kind == _ARRAY else _unfrozen(x)
    if isinstance(inner, jax.ShapeDtypeStruct):
        parts: list[Any] = [jax.ShapeDtypeStruct(inner.shape[1:], inner.dtype)] * n
    elif isinstance(inner, np.ndarray):
        parts = [inner[i, ...] for i in range(n)]  # views; 0-d arrays, not NumPy scalars
    else:
        parts = list(inner)  # one operation for all blocks (a jax array unstacks at once)
    return parts if kind == _ARRAY else [_rewrap(x, p) for p in parts]


def _same(a: object, b: object) -> bool:
    """Whether two shared values are interchangeable (typed: `1`, `1.0` and `True` differ)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        return bool(exact_key(a) == exact_key(b))
    except Exception:  # an `==` without a truth value
        return False


def _check_frozen(
    value: object, frozen: bool, k: int, other: Callable[[], int], where: Callable
) -> None:
    """Refuse block `k`'s leaf `value` unless it is frozen as block `other()`'s is."""
    if (_holder(value) is not None) != frozen:
        frozen_block, plain_block = (other(), k) if frozen else (k, other())
        text = FROZEN_SOME_MSG.format(where=where(k), frozen=frozen_block, plain=plain_block)
        raise ValueError(text)


def _combine(values: Sequence[Any], where: Callable[[int], str]) -> Any:
    """One leaf of the stack from that leaf's value in every block (`where(k)`: its path)."""
    first = values[0]

    def differs(message: str, k: int) -> str:
        return message.format(k=k, where=where(k), got=describe(values[k]), want=describe(first))

    if _is_array(_unfrozen(first)):
        frozen = _holder(first) is not None
        inner = [_unfrozen(v) if frozen else v for v in values]
        want = (tuple(inner[0].shape), inner[0].dtype)
        for k, v in enumerate(values):
            _check_frozen(v, frozen, k, lambda: 0, where)
            if not _is_array(inner[k]):
                raise TypeError(differs(MIXED_MSG, k))
            if (tuple(inner[k].shape), inner[k].dtype) != want:
                raise ValueError(differs(SHAPE_MSG, k))
        if isinstance(inner[0], jax.ShapeDtypeStruct):
            stacked: Any = jax.ShapeDtypeStruct((len(inner), *inner[0].shape), inner[0].dtype)
        elif all(isinstance(v, np.ndarray) for v in inner):
            stacked = np.stack(inner)
        else:
            stacked = jnp.stack(inner)
        return _rewrap(first, stacked) if frozen else stacked
    for k, v in enumerate(values):
        if _is_array(_unfrozen(v)):
            raise TypeError(differs(MIXED_MSG, k))
    if all(_same(v, first) for v in values):
        return first
    if is_number(first):
        # numbers of one type that differ between blocks: one per block, as an array with
        # JAX's default dtypes
        for k, v in enumerate(values):
            if type(v) is not type(first):
                raise TypeError(differs(SHARED_MSG, k))
        array = jax_holdable(np.asarray(values))
        return array.astype(jax.dtypes.canonicalize_dtype(array.dtype), copy=False)
    k = next(k for k, v in enumerate(values) if not _same(v, first))
    if _holder(first) is not None and any(
        _is_array(x) for x in jax.tree_util.tree_leaves(_unfrozen(first))
    ):
        raise ValueError(differs(FROZEN_SUBTREE_MSG, k))
    raise ValueError(differs(SHARED_MSG, k))


def _block_value(
    value: object, shape: tuple[int, ...], dtype: np.dtype, fail: Callable[..., Exception]
) -> Any:
    """`value` checked to fit one block of per-block `shape` and `dtype` (`fail(value,
    misfit=None)`: the error to raise): a number the dtype keeps (`number_misfit`), an array
    of the dtype broadcasting to `shape`, or a weak-typed scalar whose kind fits."""

    def check(number: object) -> None:
        misfit = number_misfit(number, dtype)
        if misfit is not None:
            raise fail(value, misfit)

    if is_number(value):
        check(value)
        return number_value(value, dtype)
    if not isinstance(value, jax.ShapeDtypeStruct | jax.Array | np.ndarray):
        raise fail(value)
    weak = (
        value.ndim == 0
        and getattr(value, "weak_type", False)
        and dtype_kind(dtype) in KIND_FITS.get(dtype_kind(value.dtype), "")
    )
    try:
        fits_shape = np.broadcast_shapes(tuple(value.shape), shape) == shape
    except ValueError:
        fits_shape = False
    if (value.dtype != dtype and not weak) or not fits_shape:
        raise fail(value)
    # a concrete weak scalar is checked as the number it holds; a traced one (inside
    # `jit`) cannot be, and converts as `astype` would
    if weak and value.dtype != dtype and isinstance(value, jax.Array):
        if not isinstance(value, Tracer):
            check(value.item())
    return value


def _write(leaf: Any, kind: int, writes: list[tuple[int, Any]], where: Callable[[int], str]) -> Any:
    """A stacked leaf with some blocks' slices replaced (`writes`: `(block, value)` pairs)."""
    frozen = kind == _FROZEN_ARRAY
    target = _unfrozen(leaf) if frozen else leaf
    shape, dtype = tuple(target.shape[1:]), target.dtype
    values = []

    def other() -> int:  # a block not written, for the error only
        written = {k for k, _ in writes}
        return next(b for b in range(target.shape[0]) if b not in written)

    for k, value in writes:
        _check_frozen(value, frozen, k, other, where)
        value = _unfrozen(value) if frozen else value

        def fail(got: object, misfit: tuple[type, str] | None = None, k: int = k) -> Exception:
            said = {"got": describe(got), "k": k, "where": where(k), "dtype": dtype_name(dtype)}
            if misfit is not None and misfit[0] is not TypeError:
                return NumberRangeError(RANGE_MSG.format(**said, reason=misfit[1]))
            stacked = describe(target).removeprefix("an array ")
            hint = WRITE_HINT if not _is_array(got) and not is_number(got) else ""
            text = WRITE_MSG.format(**said, stacked=stacked, block_shape=list(shape), hint=hint)
            return TypeError(text)

        values.append(_block_value(value, shape, dtype, fail))
    if isinstance(target, jax.ShapeDtypeStruct):
        return leaf  # an abstract stack: the shapes and dtypes were checked, nothing to hold
    blocks = [k for k, _ in writes]
    if isinstance(target, np.ndarray) and not any(isinstance(v, jax.Array) for v in values):
        new: Any = target.copy()
        for k, v in zip(blocks, values):
            new[k] = v
    elif len(blocks) == 1 and not getattr(target, "weak_type", False):
        # one primitive, where a scatter costs ten times as much (but a scatter keeps a weak
        # type, and `dynamic_update_slice` does not)
        value = jnp.asarray(values[0], target.dtype)
        if value.shape != shape:
            value = jnp.broadcast_to(value, shape)
        new = jax.lax.dynamic_update_index_in_dim(jnp.asarray(target), value, blocks[0], 0)
    elif len(blocks) == 1:
        new = jnp.asarray(target).at[blocks[0]].set(values[0])
    elif all(v is values[0] for v in values):
        new = jnp.asarray(target).at[np.asarray(blocks)].set(values[0])
    else:
        update = jnp.stack([jnp.broadcast_to(jnp.asarray(v, dtype), shape) for v in values])
        new = jnp.asarray(target).at[np.asarray(blocks)].set(update)
    return _rewrap(leaf, new) if frozen else new


# -- the container ----------------------------------------------------------------------------


_UNOPENED = object()  # a block the row's `replace` did not open (it stays as it is)


class _Opened(NamedTuple):
    """What the row's `open` hands `.at` for its `rebuild`."""

    blocks: list[Any]
    block_leaves: list[list[Any]]
    treedef: Any  # of one block, with frozen values as leaves
    leaves: list[Any]  # of the stack, in the same order
    kinds: list[int]


_S = TypeVar("_S", bound="StackBase")


class StackBase(Printed):
    """What `Stacked` and `Periodic` share: immutable, iterated, called through a scan."""

    __slots__ = ()
    _HOW_TO_CHANGE: ClassVar[str]  # the fix, after "A `Stacked` is immutable; "

    def scan(self, fn: Callable[..., tuple[Any, Any]], carry: Any) -> tuple[Any, Any]:
        raise NotImplementedError

    def __call__(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        """`x` through every block in turn: `block(x, *args, **kwargs)`, in one scan."""

        def step(block: Any, carry: Any) -> tuple[Any, None]:
            return block(carry, *args, **kwargs), None

        return self.scan(step, x)[0]

    def __iter__(self) -> Iterator[Any]:
        return iter(stack_of(self).unstack(self))  # type: ignore[union-attr]

    @property
    def at(self: _S) -> AtIndexer[_S]:
        """The `.at` indexer of the stack itself: `stack.at[7]["weight"].set(0.0)`."""
        return at(self)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"A `{type(self).__name__}` is immutable; {self._HOW_TO_CHANGE}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"A `{type(self).__name__}` is immutable.")


class Stacked(StackBase):
    """N blocks of one structure as one tree: every array carries a leading block axis.

    Scanned (or called), N blocks trace and compile as one. `stack[7]`, slices, iteration
    and `.at[7]` address blocks; values that are not arrays are shared by all blocks. More
    in the stacked guide.

    **Arguments**

    - `tree`: a block tree whose arrays all have the same leading axis, the blocks.
    - `length`: the number of blocks; only needed when `tree` holds no array.

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    stack = tc.Stacked({"w": jnp.zeros((6, 4, 4)), "b": jnp.zeros((6, 4))})
    assert len(stack) == 6 and stack[2]["w"].shape == (4, 4)
    stack = stack.at[2]["w"].set(1.0)  # block 2 only
    assert float(stack.tree["w"].sum()) == 16.0
    ```
    """

    __slots__ = ("_tree", "_length", "_flat", "__weakref__")
    _HOW_TO_CHANGE = "change blocks with `.at`: `model.at['blocks'][7]['weight'].set(value)`."

    _tree: Any
    _length: int
    _flat: tuple[tuple[Any, ...], tuple[int, Any]]

    def __init__(self, tree: Any, length: int | None = None) -> None:
        leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_wrapper)[0]
        arrays = [(path, _unfrozen(x)) for path, x in leaves if _is_array(_unfrozen(x))]
        source = ""
        if length is None:
            if not arrays:
                raise ValueError(NO_LENGTH_MSG)
            first_path, first = arrays[0]
            length = int(first.shape[0]) if len(first.shape) else 0
            source = f" (the first array, {_in_blocks(first_path)}, says so)"
        if not isinstance(length, int) or isinstance(length, bool) or length < 1:
            raise ValueError(f"A stack has at least one block; got length={length!r}.")
        for path, inner in arrays:
            if not _has_axis(inner, length):
                where, got = _in_blocks(path), describe(inner)
                raise ValueError(
                    LEADING_AXIS_MSG.format(where=where, got=got, n=length, source=source)
                )
        _make(tree, length, self)

    @classmethod
    def from_blocks(cls, blocks: Sequence[Any]) -> Stacked:
        """A stack of existing blocks of one structure (the inverse of `unstack`).

        **Arguments**

        - `blocks`: a non-empty sequence of trees with one structure (node types, fields,
          static values, frozen leaves), arrays of one shape and dtype per leaf, equal
          values where a leaf is not an array (differing numbers become one per block).

        **Returns**

        A `Stacked` of `len(blocks)` blocks.

        **Raises**

        `ValueError` / `TypeError` naming the first block and key path that differ from
        block 0 (`blocks[3].attn.q.weight`).

        ```python
        import jax.numpy as jnp
        import treeclass as tc

        stack = tc.Stacked.from_blocks([{"w": jnp.full((2,), float(i))} for i in range(3)])
        assert stack.tree["w"].shape == (3, 2) and stack[1]["w"].tolist() == [1.0, 1.0]
        ```
        """
        if isinstance(blocks, Stacked):
            return blocks
        blocks = list(blocks)
        if not blocks:
            raise ValueError(EMPTY_MSG)
        _check_node(blocks[0])
        flats = [jax.tree_util.tree_flatten(b, is_leaf=is_wrapper) for b in blocks]
        treedef = flats[0][1]
        for k, (_, other) in enumerate(flats[1:], start=1):
            if other != treedef:
                raise _structure_error(blocks[0], blocks[k], k, _in_blocks)
        where_of = _leaf_paths(blocks[0], _in_blocks)
        leaves = [
            _combine([leaves[j] for leaves, _ in flats], where_of(j))
            for j in range(treedef.num_leaves)
        ]
        return _make(treedef.unflatten(leaves), len(blocks))

    @classmethod
    def from_init(cls, make: Callable[[Any], Any], keys: Any) -> Stacked:
        """N blocks built by one vmapped call of `make`: the constructor is traced once.

        **Arguments**

        - `make`: a function of one key (or one slice of `keys`) returning a block.
        - `keys`: the per-block inputs, stacked: usually `jax.random.split(key, n)`; any
          pytree of arrays with a leading axis of length n.

        **Returns**

        A `Stacked` of n blocks (values that do not depend on the key come from the trace).
        """
        check_callable(make, "Stacked.from_init", "make", " of one key")
        key_leaves = jax.tree_util.tree_leaves(keys)
        if not key_leaves or not all(_is_array(k) and len(k.shape) >= 1 for k in key_leaves):
            raise TypeError(
                "`Stacked.from_init` takes the per-block keys stacked, e.g. "
                f"`jax.random.split(key, n)`; got {describe(keys)}."
            )
        n = int(key_leaves[0].shape[0])
        if n == 0:
            raise ValueError(FROM_INIT_EMPTY_MSG.format(what=describe(key_leaves[0])))
        traced: list[tuple[Any, Any]] = []  # the block's (path, leaf) pairs and tree definition

        def one(key: Any) -> list[Any]:
            block = make(key)
            _check_node(block)
            traced.append(jax.tree_util.tree_flatten_with_path(block, is_leaf=is_wrapper))
            # its arrays (made from the key, or constants), which `vmap` stacks
            inners = (_unfrozen(leaf) for _, leaf in traced[-1][0])
            return [x for x in inners if isinstance(x, jax.Array)]

        arrays = iter(jax.vmap(one)(keys))
        pairs, treedef = traced[0]
        out = []
        for path, leaf in pairs:
            inner = _unfrozen(leaf)
            if isinstance(inner, jax.Array):
                array = next(arrays)
                out.append(array if inner is leaf else _rewrap(leaf, array))
            elif isinstance(leaf, np.ndarray):  # a NumPy constant: the same in every block
                out.append(np.stack([leaf] * n))
            elif any(isinstance(x, Tracer) for x in jax.tree_util.tree_leaves(leaf)):
                raise TypeError(
                    "A block made by `Stacked.from_init` holds a value computed from its "
                    f"key that is not an array (at {_in_blocks((SequenceKey(0), *path))}, "
                    "a frozen subtree, say): only arrays can be stacked."
                )
            else:
                out.append(leaf)
        return _make(treedef.unflatten(out), n)

    @property
    def tree(self) -> Any:
        """The block tree whose arrays carry the leading block axis (what JAX sees)."""
        return self._tree

    def __len__(self) -> int:
        return self._length

    def _leaves(self) -> tuple[list[Any], Any, list[int]]:
        leaves, treedef = jax.tree_util.tree_flatten(self._tree, is_leaf=is_wrapper)
        return leaves, treedef, [_leaf_kind(x, self._length) for x in leaves]

    def __getitem__(self, index: int | slice) -> Any:
        n = self._length
        if isinstance(index, slice):
            chosen = range(n)[index]
            if not chosen:
                text = ":".join("" if v is None else str(v) for v in (index.start, index.stop))
                raise IndexError(EMPTY_SLICE_MSG.format(text=text, n=n))
            return _make(self._block(index), len(chosen))
        if isinstance(index, bool) or not isinstance(index, int | np.integer):
            raise TypeError(INDEX_TYPE_MSG.format(what=describe(index)))
        i = int(index)
        if not -n <= i < n:
            raise IndexError(INDEX_MSG.format(index=i, n=n, low=-n, high=n - 1))
        return self._block(i % n)

    def unstack(self) -> tuple[Any, ...]:
        """The blocks, as a tuple of ordinary trees (the inverse of `from_blocks`)."""
        return tuple(self._open().blocks)

    def _block(self, i: int | slice) -> Any:
        """Block `i` (in range), or blocks `i` as one tree; each leaf sliced once."""
        leaves, treedef, kinds = self._leaves()
        return treedef.unflatten([_take(x, k, i) for x, k in zip(leaves, kinds)])

    def _open(self) -> _Opened:
        n = self._length
        leaves, treedef, kinds = self._leaves()
        columns = [_split(x, k, n) for x, k in zip(leaves, kinds)]
        block_leaves = [[column[i] for column in columns] for i in range(n)]
        blocks = [treedef.unflatten(row) for row in block_leaves]
        return _Opened(blocks, block_leaves, treedef, leaves, kinds)

    def scan(
        self,
        fn: Callable[..., tuple[Any, Any]],
        carry: Any,
        xs: Any = None,
        *,
        remat: bool | Callable[..., Any] = False,
        unroll: int | bool = 1,
        reverse: bool = False,
    ) -> tuple[Any, Any]:
        """Run `fn` over the blocks in order with `jax.lax.scan`, threading a carry.

        **Arguments**

        - `fn`: `fn(block, carry) -> (carry, output)`, or with `xs`,
          `fn(block, carry, x) -> (carry, output)`; `output` may be `None`.
        - `carry`: the initial carry (any pytree of arrays).
        - `xs`: optional per-block inputs: a pytree of arrays with a leading axis of
          length `len(self)`; block i gets their slice i.
        - `remat`: `True`, or a `jax.checkpoint` policy: recompute each block's activations
          in the backward pass.
        - `unroll`, `reverse`: as for `jax.lax.scan`.

        **Returns**

        `(final_carry, outputs)`, the outputs stacked along a leading block axis.

        ```python
        import jax.numpy as jnp
        import treeclass as tc

        stack = tc.Stacked({"scale": jnp.array([1.0, 2.0, 3.0])})
        total, seen = stack.scan(lambda b, c: (c * b["scale"], c), jnp.float32(1.0))
        assert float(total) == 6.0 and seen.tolist() == [1.0, 1.0, 2.0]
        ```
        """
        check_callable(fn, "Stacked.scan", "fn", " of (block, carry)")
        leaves, treedef, kinds = self._leaves()
        scanned = [
            x if k == _ARRAY else _unfrozen(x) for x, k in zip(leaves, kinds) if k != _SHARED
        ]
        # a leaf of a field declared `role="frozen"` stops its gradient before the scan, not
        # only at its read inside the body: else the scan's transpose builds a stacked zero
        # cotangent for it, a temporary as large as the frozen weights
        roles = leaf_roles(self._tree)
        stopped = [r == FROZEN and k == _ARRAY for r, k in zip(roles, kinds) if k != _SHARED]
        if any(stopped):
            scanned = [stop_gradient_if_traced(x) if s else x for x, s in zip(scanned, stopped)]
        with_xs = xs is not None

        def body(carry: Any, inputs: Any) -> Any:
            sliced, x = inputs
            parts = iter(sliced)
            block_leaves = [
                leaf if k == _SHARED else next(parts) if k == _ARRAY else _rewrap(leaf, next(parts))
                for leaf, k in zip(leaves, kinds)
            ]
            block = treedef.unflatten(block_leaves)
            # the block's frozen slices were stopped before the scan: reads keep them as
            # they are (a saved residual is then the slice itself, not a copy)
            with gradients_stopped([v for v, s in zip(sliced, stopped) if s]):
                out = fn(block, carry, x) if with_xs else fn(block, carry)
            return scan_result(out, "Stacked.scan", "a block of the stack")

        if remat is not False and remat is not None:
            body = jax.checkpoint(body, policy=None if remat is True else remat)
        return jax.lax.scan(
            body, carry, (scanned, xs), length=self._length, unroll=unroll, reverse=reverse
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (_make, (self._tree, self._length))


class StackedKind(NodeKind["Stacked"]):
    """A stack's row: `.at` opens it into its blocks `[i]`; rebuilding writes only the
    changed blocks' slices; the roles are those its block's class declares."""

    def open(self, node: Stacked) -> Opened:
        opened = node._open()
        entries = tuple(SequenceKey(i) for i in range(node._length))
        return Opened(entries, list(opened.blocks), opened)

    def child(self, node: Stacked, key: str | int) -> tuple[Any, Any] | None:
        """Block `key` alone (each leaf sliced once), or None if there is none."""
        i = block_index(key, node._length)
        if i is None:
            return None
        return SequenceKey(i), node._block(i)

    def replace(
        self,
        node: Stacked,
        entry: Any,
        old: object,
        new: object,
        path: tuple[Any, ...] = (),
        where: Callable[[tuple], str] = keystr,
    ) -> Any:
        """The stack with block `entry.idx` (`old`, from `child`) replaced by `new`."""
        i = entry.idx
        leaves, treedef, kinds = node._leaves()
        n = node._length
        # the other blocks are not opened: only their shared leaves are ever read back
        others = [x if k == _SHARED else None for x, k in zip(leaves, kinds)]
        block_leaves = [others] * n
        block_leaves[i] = jax.tree_util.tree_leaves(old, is_leaf=is_wrapper)
        blocks: list[Any] = [_UNOPENED] * n
        blocks[i] = old
        children = list(blocks)
        children[i] = new
        aux = _Opened(blocks, block_leaves, treedef, leaves, kinds)
        return self.rebuild(node, aux, children, False, path, where)

    def rebuild(
        self,
        node: Stacked,
        aux: Any,
        children: Sequence[Any],
        partial: bool = False,
        path: tuple[Any, ...] = (),
        where: Callable[[tuple], str] = keystr,
    ) -> Any:
        n = node._length
        changed = [k for k in range(n) if children[k] is not aux.blocks[k]]
        if not changed:
            return node

        def below(keys: tuple) -> str:
            return where(path + keys)

        try:
            return _write_blocks(aux, children, changed, n, below)
        except (ValueError, TypeError):
            if partial:  # a `get` with fill values: the blocks, unstacked
                return tuple(children)
            raise

    stack: Stack[Stacked] = Stack(
        length=lambda node: node._length,
        unstack=lambda node: node.unstack(),
        restack=lambda node, blocks: Stacked.from_blocks(blocks),
    )
    display: Display[Stacked] = Display(
        children=lambda node: _print_children(node),
        type_name=lambda node: f"Stacked[{node._length}×{type(node._tree).__name__}]",
    )

    def roles_of(self, node: Stacked) -> Any:
        return node._tree


def _write_blocks(
    aux: _Opened, children: Sequence[Any], changed: list[int], n: int, where: Callable
) -> Stacked:
    """The stack with blocks `changed` replaced by `children`'s (changed leaves only)."""
    new_leaves: dict[int, list[Any]] = {}
    for k in changed:
        leaves, treedef = jax.tree_util.tree_flatten(children[k], is_leaf=is_wrapper)
        if treedef != aux.treedef:
            if len(changed) == n:  # every block changed alike: a new structure is fine
                return Stacked.from_blocks(children)
            raise _structure_error(aux.blocks[k], children[k], k, where)
        new_leaves[k] = leaves
    where_of = _leaf_paths(aux.blocks[changed[0]], where)
    out = list(aux.leaves)
    for j, (leaf, kind) in enumerate(zip(aux.leaves, aux.kinds)):
        writes = [
            (k, new[j]) for k, new in new_leaves.items() if new[j] is not aux.block_leaves[k][j]
        ]
        if not writes:
            continue
        # one array given to every block (a `set` through `...`) is a block write like one
        # through an index, so it must fit a block; only per-block results re-stack, and so
        # does a value frozen unlike the leaf (every block written: none is left unlike it)
        first = writes[0][1]
        one_array = (
            _is_array(_unfrozen(first))
            and (_holder(first) is not None) == (kind == _FROZEN_ARRAY)
            and all(v is first for _, v in writes)
        )
        if kind != _SHARED and (len(writes) < n or one_array):
            out[j] = _write(leaf, kind, writes, where_of(j))
        else:
            column = [row[j] for row in aux.block_leaves]
            for k, value in writes:
                column[k] = value
            out[j] = _combine(column, where_of(j))
    return _make(aux.treedef.unflatten(out), n)


def _make(tree: object, length: int, stack: Stacked | None = None) -> Stacked:
    _check_node(tree)
    # the tree's children and its one-level tree definition: what a `Stacked` flattens to
    children, treedef = jax.tree_util.tree_flatten(tree, is_leaf=lambda x: x is not tree)
    new = object.__new__(Stacked) if stack is None else stack
    return _store(new, tree, (tuple(children), (length, treedef)))


def _store(stack: Stacked, tree: object, flat: tuple[tuple[Any, ...], tuple[int, Any]]) -> Stacked:
    store = object.__setattr__
    store(stack, "_tree", tree)
    store(stack, "_length", flat[1][0])
    store(stack, "_flat", flat)
    return stack


def _check_node(tree: object) -> None:
    if is_wrapper(tree) or is_leaf_node(tree):
        raise TypeError(NOT_A_NODE_MSG.format(what=describe(tree)))


def _flatten_with_keys(stack: Stacked) -> tuple[list[tuple[Any, Any]], Any]:
    tree = stack._tree
    pairs = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is not tree)[0]
    return [(path[0], child) for path, child in pairs], stack._flat[1]


def _unflatten(aux: tuple[int, Any], children: Any) -> Stacked:
    # no checks: JAX rebuilds trees with any leaves (tracers, None, sentinel objects)
    return _store(object.__new__(Stacked), aux[1].unflatten(children), (tuple(children), aux))


jax.tree_util.register_pytree_with_keys(
    Stacked, _flatten_with_keys, _unflatten, operator.attrgetter("_flat")
)


def block_index(key: object, n: int) -> int | None:
    """`key` as the index of one of `n` blocks (negative counts from the end), or None."""
    if type(key) is not int:
        return None
    i = key + n if key < 0 else key
    return i if 0 <= i < n else None


STACKED_KIND = StackedKind()
register_kind(Stacked, STACKED_KIND)


def _in_blocks(keys: tuple) -> str:
    """The text of a key path below a stack of blocks given alone: `blocks[3].attn.q`."""
    return "blocks" + jax.tree_util.keystr(keys)


def _leaf_paths(block: object, where: Callable[[tuple], str]) -> Callable[..., Any]:
    """`of(j)(k)`: the text of leaf `j`'s key path in block `k`, worked out on demand."""
    paths: list[tuple[Any, ...]] = []

    def of(j: int) -> Callable[[int], str]:
        def text(k: int) -> str:
            if not paths:
                pairs = jax.tree_util.tree_flatten_with_path(block, is_leaf=is_wrapper)[0]
                paths.extend(p for p, _ in pairs)
            return where((SequenceKey(k), *paths[j]))

        return text

    return of


def _structure_error(first: object, other: object, k: int, where: Callable) -> Exception:
    found = first_mismatch(first, other, is_leaf=is_wrapper)
    place = where((SequenceKey(k), *(() if found is None else found.path)))
    if found is None:
        reason = "they differ"
    else:
        reason = f"block 0 has {found.tree_has}, block {k} has {found.other_has}"
        if found.only_tree:
            reason += f"; only block 0 has {', '.join(found.only_tree)}"
        if found.only_other:
            reason += f"; only block {k} has {', '.join(found.only_other)}"
    return ValueError(STRUCTURE_MSG.format(k=k, where=place, reason=reason))


# -- printing ---------------------------------------------------------------------------------


class _BlockLeaf:
    """A stacked array as the printers show it, `48×f32[256,256](μ=…, σ=…, ∈[…])`."""

    __slots__ = ("value", "length")

    def __init__(self, value: object, length: int) -> None:
        self.value = value  # the stacked array, or a frozen value holding one
        self.length = length

    @property
    def array(self) -> Any:
        return _unfrozen(self.value)

    def block_type(self) -> str:
        x = self.array
        block = array_type(x.dtype, tuple(x.shape[1:]))
        wrapper = wrapper_of(self.value)
        return f"{'' if wrapper is None else wrapper.mark}{self.length}×{block}"

    def __repr__(self) -> str:
        # the array's own text (its statistics over every block), headed by the block type
        return array_repr(self.array, head=self.block_type())

    def __treescope_repr__(self, path: str | None, subtree_renderer: object) -> Any:
        from treescope import rendering_parts as parts

        return parts.build_one_line_tree_node(parts.text(repr(self)), path=path)


jax.tree_util.register_pytree_node(
    _BlockLeaf,
    lambda leaf: ((leaf.value,), leaf.length),
    lambda length, children: _BlockLeaf(children[0], length),
)


def _print_children(stack: Stacked) -> list[tuple[Any, Any]]:
    """The block tree's children with their arrays shown per block (`48×f32[256,256]`)."""
    n = stack._length

    def view(x: object) -> Any:
        return x if _leaf_kind(x, n) == _SHARED else _BlockLeaf(x, n)

    return [
        (key, jax.tree_util.tree_map(view, child, is_leaf=is_wrapper))
        for key, child in _flatten_with_keys(stack)[0]
    ]


def _leaf_size(leaf: _BlockLeaf) -> int:
    try:
        itemsize = np.dtype(leaf.array.dtype).itemsize
    except TypeError:  # extended dtypes (PRNG keys)
        itemsize = getattr(leaf.array.dtype, "itemsize", 0)
    return int(leaf.array.size) * itemsize


register_printer(
    _BlockLeaf,
    repr=repr,
    str=lambda leaf: tree_str(leaf.value),
    type_name=_BlockLeaf.block_type,
    count=lambda leaf: int(leaf.array.size),
    size=_leaf_size,
)


# -- converting between stacked and unstacked trees --------------------------------------------


def _is_stack(x: object) -> bool:
    """A node whose row has a stack part (a `Stacked`, a `Periodic`, ...)."""
    return stack_of(x) is not None


def _unstacked(x: object) -> tuple[Any, ...]:
    return stack_of(x).unstack(x)  # type: ignore[union-attr]


def _length(x: Any) -> int:
    stack = stack_of(x)
    return len(x) if stack is None else stack.length(x)


def unstack_all(tree: _T) -> _T:
    """`tree` with every stack replaced by the tuple of its blocks (nested ones too).

    **Arguments**

    - `tree`: any pytree.

    **Returns**

    `tree` with tuples of blocks in place of stacks.

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    model = {"blocks": tc.Stacked({"w": jnp.zeros((3, 2))}), "head": jnp.ones(2)}
    flat = tc.unstack_all(model)
    assert len(flat["blocks"]) == 3 and flat["blocks"][0]["w"].shape == (2,)
    ```
    """

    def replace(x: Any) -> Any:
        return tuple(unstack_all(block) for block in _unstacked(x)) if _is_stack(x) else x

    return jax.tree_util.tree_map(replace, tree, is_leaf=_is_stack)


def _stackdescribe(x: Any) -> str:
    kind = "a stack" if isinstance(x, Stacked) else f"a `{type(x).__name__}`"
    return f"{kind} of {_length(x)} blocks"


def restack(tree: object, like: object) -> Any:
    """`tree` converted exactly to the stacking of `like`: stacks (`Stacked`, `Periodic`)
    where `like` has them, tuples or lists of blocks where `like` has those.

    **Arguments**

    - `tree`: the tree to convert (a model, or a loaded checkpoint).
    - `like`: a tree of the layout wanted.

    **Returns**

    `tree` in `like`'s layout.

    **Raises**

    `ValueError` naming the key path where the two trees differ otherwise (another
    number of blocks, other keys).

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    stacked = {"blocks": tc.Stacked({"w": jnp.arange(6.0).reshape(3, 2)})}
    back = tc.restack(tc.unstack_all(stacked), stacked)
    assert tc.is_tree_equal(back, stacked)
    ```
    """
    return _restack(tree, like, (), tree)


def _restack(tree: Any, like: Any, path: tuple[Any, ...], root: Any) -> Any:
    def error(got: object, want: object) -> ValueError:
        where = root_name(root) + jax.tree_util.keystr(path)
        return ValueError(RESTACK_MSG.format(where=where, got=got, want=want))

    if _is_stack(tree) or _is_stack(like):
        # a stack against a stack of its kind and length, or a tuple or list of as many blocks
        def mismatch(other: Callable[[Any], str]) -> ValueError:
            got, want = (_stackdescribe(x) if _is_stack(x) else other(x) for x in (tree, like))
            return error(got, want)

        if _is_stack(tree) and _is_stack(like):
            if type(tree) is not type(like) or _length(tree) != _length(like):
                raise mismatch(describe)
            return tree
        if type(like if _is_stack(tree) else tree) not in (list, tuple):
            raise mismatch(describe)
        if _length(tree) != _length(like):
            raise mismatch(lambda x: f"{len(x)} blocks")
        if _is_stack(tree):
            pairs = zip(_unstacked(tree), like)
        else:  # a stack's blocks share one structure: its block 0 is every block's template
            templates = [like[0]] * len(tree) if type(like) is Stacked else _unstacked(like)
            pairs = zip(tree, templates)
        blocks = [_restack(b, t, (*path, SequenceKey(i)), root) for i, (b, t) in enumerate(pairs)]
        if _is_stack(tree):
            return type(like)(blocks)
        return stack_of(like).restack(like, blocks)  # type: ignore[union-attr]
    if not any(map(_is_stack, jax.tree_util.tree_leaves((tree, like), is_leaf=_is_stack))):
        return tree
    tree_kind, like_kind = node_kind(tree, is_wrapper), node_kind(like, is_wrapper)
    tree_opened, like_opened = open_node(tree, tree_kind), open_node(like, like_kind)
    if tree_opened is None or like_opened is None or tree_opened.entries != like_opened.entries:
        raise error(describe(tree), describe(like))
    children = [
        _restack(child, template, (*path, e), root)
        for e, child, template in zip(
            tree_opened.entries, tree_opened.children, like_opened.children
        )
    ]
    if all(new is old for new, old in zip(children, tree_opened.children)):
        return tree
    return rebuild(tree, tree_kind, tree_opened.aux, children)
