"""Freezing and masking: hide values from JAX transformations on the pytree level.

A frozen value is a pytree node *without children* whose wrapped value lives in the
node's auxiliary data. `jax.jit`, `jax.grad`, `jax.vmap`, `jax.lax.scan` and optax only
see leaves, so they never see a frozen value; `jax.jit` treats it as static because the
tree definition (which holds it) is part of the compilation cache key.

That puts the frozen value on the hot path of every jitted call: the cache lookup compares
the call's tree definition with the cached one, and hashes it where it needs to. So the
hash is computed once, when the value is frozen, and equality checks identity first.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import re
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from . import _node, _structure
from ._keys import ByIdentity, value_key
from ._util import add_leaf_note, check_callable, leaf_path_str

__all__ = ["freeze", "unfreeze", "is_frozen", "is_nondiff", "tree_mask", "tree_unmask"]

PyTree = Any
_T = TypeVar("_T")


# --------------------------------------------------------------------------------------
# Fingerprints: what a frozen value is hashed and compared by
# --------------------------------------------------------------------------------------


class _ArrayKey:
    """Key of an array: type, shape, dtype, weak type and a digest of the bytes.

    The bytes are read (copied to the host once) when the key is made. Equality falls back
    to comparing the bytes themselves only when the digests agree, which for distinct
    objects happens only when the arrays really are equal.
    """

    __slots__ = ("array", "meta", "digest", "hash")

    def __init__(self, array: Any, meta: tuple, host: np.ndarray) -> None:
        self.array = array
        self.meta = meta
        self.digest = hashlib.blake2b(host.data, digest_size=16).digest()
        self.hash = hash((meta, self.digest))

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not _ArrayKey:
            return False
        if self.hash != other.hash or self.meta != other.meta or self.digest != other.digest:
            return False
        # bitwise, so that a NaN equals the same NaN and 0.0 differs from -0.0: exactly
        # when a computation that bakes the array in as a constant would be the same
        return bool(np.array_equal(_host_bytes(self.array), _host_bytes(other.array)))


def _host_bytes(array: Any) -> np.ndarray:
    """The array's bytes on the host, as a flat uint8 view (no copy where none is needed)."""
    if jnp.issubdtype(array.dtype, jax.dtypes.prng_key):
        array = jax.random.key_data(array)
    host = np.asarray(array)
    if host.dtype == object:  # the bytes would be pointers
        raise TypeError("object arrays have no value bytes")
    return np.ascontiguousarray(host).reshape(-1).view(np.uint8)


def _array_key(array: Any) -> Any:
    try:
        host = _host_bytes(array)
    except Exception:  # an object array, or one sharded over devices we cannot read
        return ByIdentity(array)
    meta = (type(array), array.shape, str(array.dtype), bool(getattr(array, "weak_type", False)))
    return _ArrayKey(array, meta, host)


def _leaf_key(leaf: Any) -> Any:
    if isinstance(leaf, Tracer):
        return ByIdentity(leaf)
    if isinstance(leaf, (jax.Array, np.ndarray)):
        return _array_key(leaf)
    try:
        # typed and exact: 1, 1.0 and True, or 0.0 and -0.0, are equal in Python, but a
        # function traced with one is not the function traced with another
        return value_key(leaf)
    except TypeError:
        return ByIdentity(leaf)


def _fingerprint(value: Any) -> Any:
    """A hashable key with the equality we want for `value`, computed once at freeze time."""
    if isinstance(value, (jax.Array, np.ndarray, np.generic, str, int, float, complex)):
        return _leaf_key(value)
    try:
        leaves, treedef = jax.tree_util.tree_flatten(value)
    except Exception:
        return _leaf_key(value)
    if treedef.num_nodes == 1 and treedef.num_leaves == 1:
        return _leaf_key(value)
    # a container (a tuple, a dict, a TreeClass): key it by structure and leaves, so that
    # equal but distinct subtrees are equal. Some containers' `==` is elementwise, so
    # their own `==`/hash cannot be used.
    key = (treedef, tuple(_leaf_key(leaf) for leaf in leaves))
    try:
        hash(key)
    except TypeError:  # unhashable node data
        return ByIdentity(value)
    return key


# --------------------------------------------------------------------------------------
# The frozen node
# --------------------------------------------------------------------------------------

_OPERATION_ON_FROZEN = (
    "cannot compute `{expr}` with the frozen value x = {value}: a frozen value is hidden from "
    "JAX and supports no operations or calls. Unfreeze it first:\n"
    "    before: {expr}\n"
    "    after:  {fixed}\n"
    "or unfreeze a whole tree with `tc.tree_unmask(tree)` inside the transformed function."
)


_ATTRIBUTE_OF_FROZEN = (
    "a frozen value has no attribute {name!r}; the value inside it may. Unfreeze it first:\n"
    "    before: x.{name}\n"
    "    after:  tc.unfreeze(x).{name}"
)


class _Frozen:
    """A value wrapped in a pytree node without children (see `freeze`)."""

    __slots__ = ("_value", "_key", "_hash")

    def __init__(self, value: Any) -> None:
        key = _fingerprint(value)
        object.__setattr__(self, "_value", value)
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_hash", hash(key))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not _Frozen:
            return NotImplemented
        if self._hash != other._hash:
            return False
        try:
            return bool(self._key == other._key)
        except Exception:  # a value whose `==` has no truth value (elementwise, say)
            return False

    # The printers live a floor above (`_pprint` imports this module), hence the imports
    # at call time; by then `treeclass` has loaded them. One text for a frozen value
    # everywhere: `repr(tc.freeze(x)) == tc.tree_repr(tc.freeze(x))`, `#` + x's tree repr.
    def __repr__(self) -> str:
        from ._pprint import tree_repr

        return tree_repr(self)

    def __str__(self) -> str:
        from ._pprint import tree_str

        return tree_str(self)

    def __treescope_repr__(self, path: str | None, subtree_renderer: Any) -> Any:
        # called by treescope only, once it is imported; we never import it ourselves
        from ._pprint_html import frozen_treescope_repr

        return frozen_treescope_repr(self, path, subtree_renderer)

    def __getattr__(self, name: str) -> Any:
        # only reached for missing attributes; protocol probes (`__array_priority__`, ...)
        # get the plain error they expect
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(_ATTRIBUTE_OF_FROZEN.format(name=name))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a frozen value is immutable; use `tc.unfreeze` to get the value")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("a frozen value is immutable; use `tc.unfreeze` to get the value")

    def __copy__(self) -> _Frozen:
        return self

    def __deepcopy__(self, memo: dict) -> _Frozen:
        return _Frozen(copy.deepcopy(self._value, memo))

    def __reduce__(self) -> tuple:
        # the hash is recomputed on load: str hashes differ between processes
        return (freeze, (self._value,))


class FrozenOperationError(NotImplementedError, TypeError):
    """An operation on a frozen value (which supports none): unfreeze it first.

    A `NotImplementedError`, as PyTreeClass raises, and a `TypeError`, as Python raises
    for an operation a type does not support.
    """


def _refuse(expr: str) -> Callable[..., Any]:
    fixed = re.sub(r"\bx\b", "tc.unfreeze(x)", expr)

    def method(self: _Frozen, *args: Any, **kwargs: Any) -> Any:
        raise FrozenOperationError(
            _OPERATION_ON_FROZEN.format(expr=expr, fixed=fixed, value=_short(self))
        )

    return method


_REFUSED_OPERATIONS = {
    "__add__": "x + y", "__radd__": "y + x", "__sub__": "x - y", "__rsub__": "y - x",
    "__mul__": "x * y", "__rmul__": "y * x", "__matmul__": "x @ y", "__rmatmul__": "y @ x",
    "__truediv__": "x / y", "__rtruediv__": "y / x",
    "__floordiv__": "x // y", "__rfloordiv__": "y // x",
    "__mod__": "x % y", "__rmod__": "y % x", "__pow__": "x ** y", "__rpow__": "y ** x",
    "__divmod__": "divmod(x, y)", "__rdivmod__": "divmod(y, x)",
    "__and__": "x & y", "__rand__": "y & x", "__or__": "x | y", "__ror__": "y | x",
    "__xor__": "x ^ y", "__rxor__": "y ^ x", "__lshift__": "x << y", "__rlshift__": "y << x",
    "__rshift__": "x >> y", "__rrshift__": "y >> x",
    "__lt__": "x < y", "__le__": "x <= y", "__gt__": "x > y", "__ge__": "x >= y",
    "__neg__": "-x", "__pos__": "+x", "__abs__": "abs(x)", "__invert__": "~x",
    "__getitem__": "x[i]", "__iter__": "iter(x)", "__call__": "x(...)",
    "__array__": "np.asarray(x)", "__jax_array__": "jnp.asarray(x)",
}  # fmt: skip

for _name, _expr in _REFUSED_OPERATIONS.items():
    setattr(_Frozen, _name, _refuse(_expr))
del _name, _expr


def _flatten_frozen(frozen: _Frozen) -> tuple[tuple, _Frozen]:
    return (), frozen


def _unflatten_frozen(frozen: _Frozen, children: Any) -> _Frozen:
    return frozen


jax.tree_util.register_pytree_with_keys(
    _Frozen, _flatten_frozen, _unflatten_frozen, flatten_func=_flatten_frozen
)


def freeze(x: _T) -> _T:
    """Wrap `x` in a node without children, so JAX transformations do not see it.

    The frozen value is static under `jax.jit` (a changed value retraces, an equal one does
    not), carried unchanged through `jax.grad`, `jax.vmap`, `jax.lax.scan` and optax, and
    refuses arithmetic and calls (`FrozenOperationError`, a `NotImplementedError` and a
    `TypeError`) until unfrozen. Freezing is idempotent.

    Freezing takes a snapshot: a writable NumPy array is copied (read-only) and containers
    are rebuilt, so changing the original later changes neither the frozen value nor the
    traces `jax.jit` made with it.

    Two frozen values are equal when their values are of the same type and equal exactly:
    `-0.0` and `0.0` differ (so do `1`, `1.0` and `True`), a NaN equals a NaN with the
    same bits; arrays when their type, shape, dtype and bytes are (the bytes are read, and
    hashed, once, here); subtrees when their structure and leaves are. Values with no
    usable hash fall back to identity. The hash is computed once, so the `jax.jit` cache
    lookup costs the same for a frozen array as for a frozen `int`.

    **Arguments**

    - `x`: any value: an array, a scalar, a string, a function, a whole subtree.

    **Returns**

    The frozen value; its `repr` is the value's marked with `#`.

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    tree = {"w": jnp.ones(2), "n": tc.freeze(2)}
    assert jax.tree_util.tree_leaves(tree) == [tree["w"]]   # the frozen 2 is hidden
    assert tc.unfreeze(tree["n"]) == 2
    ```
    """
    if type(x) is _Frozen:
        return x
    # typed as `x`'s own type: a frozen value stands in for its value in a tree, so a
    # field keeps the annotation of what it holds (unfreeze before use; no checker knows)
    return _Frozen(_snapshot(x))  # type: ignore[return-value]


def _copy_array(x: Any) -> Any:
    # Any NumPy array may change under us: a writable one, a read-only view of a writable
    # buffer, a read-only array its owner can make writable again. So each is copied (a
    # private, read-only copy, of the same class). Object arrays are keyed by identity
    # (their bytes are pointers): kept as they are.
    if isinstance(x, np.ndarray) and x.dtype != object:
        x = x.copy()
        x.flags.writeable = False
    return x


def _snapshot(x: Any) -> Any:
    """`x` as it is now: NumPy arrays copied (read-only), containers rebuilt.

    A frozen value is hashed once, when frozen, and `jax.jit` bakes it into traces; if the
    caller could still change it in place, a later call would silently reuse a trace made
    for the old value.
    """
    if isinstance(x, np.ndarray):
        return _copy_array(x)
    if isinstance(x, (jax.Array, str, bytes, int, float, complex, np.generic)) or x is None:
        return x
    try:
        leaves, treedef = jax.tree_util.tree_flatten(x, is_leaf=is_frozen)
    except Exception:  # not a pytree we can take apart: keep it as it is
        return x
    if treedef.num_nodes == 1:  # a leaf (a function, an object): nothing to rebuild
        return x
    try:
        return treedef.unflatten([_copy_array(leaf) for leaf in leaves])
    except Exception:  # a node that cannot be rebuilt: keep it as it is
        return x


def unfreeze(x: _T) -> _T:
    """The value inside a frozen `x`; any other `x` is returned unchanged.

    ```python
    import treeclass as tc

    assert tc.unfreeze(tc.freeze("relu")) == "relu"
    assert tc.unfreeze(1.0) == 1.0
    ```
    """
    if isinstance(x, _Frozen):  # (`type(x) is` would not narrow a type variable for mypy)
        return x._value
    return x


def is_frozen(x: Any) -> bool:
    """Whether `x` was made by `freeze`.

    ```python
    import treeclass as tc

    assert tc.is_frozen(tc.freeze(1)) and not tc.is_frozen(1)
    ```
    """
    return type(x) is _Frozen


# --------------------------------------------------------------------------------------
# Differentiability
# --------------------------------------------------------------------------------------


@functools.cache
def _is_inexact_dtype(dtype: Any) -> bool:
    # jax.dtypes knows bfloat16 & co. and the extended (key) dtypes; numpy does not
    return bool(jnp.issubdtype(dtype, np.inexact))


def is_nondiff(x: Any) -> bool:
    """Whether `jax.grad` cannot differentiate `x`.

    False only for inexact (floating or complex) Python scalars and arrays; True for ints,
    bools, integer, boolean and key arrays, strings, `None`, functions and other objects.
    The default condition of `tree_mask`.

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    assert not tc.is_nondiff(1.0) and not tc.is_nondiff(jnp.ones(2))
    assert tc.is_nondiff(1) and tc.is_nondiff(jnp.arange(2)) and tc.is_nondiff("relu")
    ```
    """
    if isinstance(x, (float, complex)):
        return False
    if isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)):
        return not _is_inexact_dtype(x.dtype)
    return True


# --------------------------------------------------------------------------------------
# Masking whole trees
# --------------------------------------------------------------------------------------

_MASK_DOES_NOT_FIT = (
    "the mask does not fit the tree at `{path}`: {reason}.\n"
    "A mask tree needs the tree's structure with a bool at every leaf; build it from the "
    "tree itself, e.g.\n"
    "    mask = jax.tree_util.tree_map(lambda x: ..., tree)"
)

_MASK_LEAF_NOT_BOOL = (
    "the mask has {value} at `{path}`, expected True or False (a bool scalar): a leaf is "
    "frozen whole or not at all."
)
_MASK_AND_COND_MSG = (
    "`{name}` takes the mask (or predicate) as `mask=` (PyTreeClass) or `cond=` (sepes), not both."
)


def _is_predicate(cond: Any) -> bool:
    # A TreeClass layer may define __call__, yet as `cond` it is a mask tree
    return callable(cond) and not _node.is_treeclass(cond)


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 40 else text[:37] + "..."


def _mask_leaves(
    tree: Any, mask: Any, is_leaf: Callable[[Any], bool] | None, frozen_may_be_leaves: bool
) -> tuple[list, list, Any]:
    """Leaves of `tree` (split with `is_leaf`) and the mask's bools, or a ValueError.

    A frozen value in the mask (a mask built with `tree_map` over a tree that holds values
    the class froze keeps them) stands for `False`: it is left as it is.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=is_leaf)
    flags, mask_def = jax.tree_util.tree_flatten(mask, is_leaf=is_frozen)
    if mask_def != treedef and frozen_may_be_leaves:
        # a mask made from the tree with its frozen values as leaves fits too
        leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=_frozen_or(is_leaf))
    if mask_def != treedef:
        split = _frozen_or(is_leaf) if frozen_may_be_leaves else is_leaf
        found = _structure.first_mismatch(tree, mask, is_leaf=split)
        if found is None:
            path, reason = (), "the structures differ"
        else:
            path, reason = found.path, found.explain("mask")
        raise ValueError(
            _MASK_DOES_NOT_FIT.format(path=_structure.path_str(tree, path), reason=reason)
        )
    for i, flag in enumerate(flags):
        if type(flag) is _Frozen:
            flags[i] = False
        elif not _is_bool_scalar(flag):
            paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(mask, is_leaf=is_frozen)[0]]
            raise ValueError(
                _MASK_LEAF_NOT_BOOL.format(
                    value=_short(flag), path=_structure.path_str(tree, paths[i])
                )
            )
    return leaves, flags, treedef


def _is_bool_scalar(x: Any) -> bool:
    if isinstance(x, (bool, np.bool_)):
        return True
    return (
        isinstance(x, (jax.Array, np.ndarray))
        and not isinstance(x, Tracer)
        and x.shape == ()
        and x.dtype == np.bool_
    )


_UNSET: Any = object()


def _one_condition(name: str, mask: Any, cond: Any, default: Any) -> Any:
    if mask is not _UNSET and cond is not _UNSET:
        raise TypeError(_MASK_AND_COND_MSG.format(name=name))
    if mask is not _UNSET:
        return mask
    return default if cond is _UNSET else cond


def _map_predicate(fn: Callable[[Any], Any], tree: Any, is_leaf: Any, what: str) -> Any:
    """`tree_map(fn, tree)`; an error raised by the user's predicate names the leaf's path."""
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=is_leaf)
    out = []
    try:
        for leaf in leaves:
            out.append(fn(leaf))
    except Exception as error:
        add_leaf_note(error, f"raised by the {what} at {leaf_path_str(tree, len(out), is_leaf)}")
        raise
    return treedef.unflatten(out)


def tree_mask(
    tree: _T,
    mask: Callable[[Any], bool] | PyTree = _UNSET,
    *,
    cond: Callable[[Any], bool] | PyTree = _UNSET,
    is_leaf: Callable[[Any], bool] | None = None,
) -> _T:
    """Freeze the leaves of `tree` where the mask holds; the input is not changed.

    **Arguments**

    - `tree`: any pytree; leaves already frozen stay frozen.
    - `mask` (PyTreeClass's name) or `cond` (sepes's name), one of the two: a predicate
      called on every leaf, or a mask tree: `tree`'s structure with a bool at every leaf
      (the leaves to freeze are True). Default `is_nondiff`: freeze all that `jax.grad`
      cannot differentiate.
    - `is_leaf`: as in `jax.tree_util.tree_map`, to freeze whole subtrees.

    **Returns**

    A new tree, `tree` with the chosen leaves frozen.

    **Raises**

    `ValueError` naming the key path where a mask tree does not fit `tree`; an error
    raised by the predicate gets a note naming the leaf.

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    model = {"w": jnp.ones(3), "act": "relu", "n": 2}
    masked = tc.tree_mask(model)                      # freezes "act" and "n"
    grads = jax.grad(lambda m: (tc.tree_unmask(m)["w"] ** 2).sum())(masked)
    assert tc.is_frozen(grads["act"]) and grads["w"].shape == (3,)
    assert tc.is_tree_equal(tc.tree_unmask(masked), model)
    assert tc.tree_mask(model, mask={"w": False, "act": True, "n": False})["n"] == 2
    ```
    """
    cond = _one_condition("tree_mask", mask, cond, is_nondiff)
    check_callable(is_leaf, "tree_mask", "is_leaf", optional=True)
    if _is_predicate(cond):

        def mask_leaf(x: Any) -> Any:
            return freeze(x) if cond(x) else x

        return _map_predicate(mask_leaf, tree, is_leaf, "mask predicate")
    leaves, flags, treedef = _mask_leaves(tree, cond, is_leaf, frozen_may_be_leaves=True)
    return treedef.unflatten([freeze(x) if f else x for x, f in zip(leaves, flags)])


def _everything(_: Any) -> bool:
    return True


def tree_unmask(
    tree: _T,
    mask: Callable[[Any], bool] | PyTree = _UNSET,
    *,
    cond: Callable[[Any], bool] | PyTree = _UNSET,
) -> _T:
    """Unfreeze the frozen leaves of `tree` where the mask holds (all by default).

    Without a mask this undoes *every* freeze in the tree, also values a class froze on
    purpose (`activation = tc.freeze(jax.nn.relu)`); to undo only what `tree_mask`
    froze, pass the same mask tree (a frozen value in the mask is left frozen). A
    predicate sees only the values, so it cannot tell the two apart.

    **Arguments**

    - `tree`: any pytree.
    - `mask` or `cond`, one of the two: a predicate called with the *unfrozen* value of
      every frozen leaf, or a mask tree with a bool at every leaf of `tree`, counting
      frozen values as leaves (so the mask given to `tree_mask` fits).

    **Returns**

    A new tree; the input is not changed.

    **Raises**

    `ValueError` naming the key path where a mask tree does not fit `tree`.

    ```python
    import treeclass as tc

    masked = tc.tree_mask({"a": 1, "b": "x", "c": 2.0})
    assert tc.tree_unmask(masked) == {"a": 1, "b": "x", "c": 2.0}
    only_ints = tc.tree_unmask(masked, cond=lambda v: isinstance(v, int))
    assert only_ints["a"] == 1 and tc.is_frozen(only_ints["b"])
    ```
    """
    cond = _one_condition("tree_unmask", mask, cond, _everything)
    if _is_predicate(cond):

        def unmask_leaf(x: Any) -> Any:
            if type(x) is _Frozen and cond(x._value):
                return x._value
            return x

        return _map_predicate(unmask_leaf, tree, is_frozen, "unmask predicate")
    leaves, flags, treedef = _mask_leaves(tree, cond, is_frozen, frozen_may_be_leaves=False)
    return treedef.unflatten([unfreeze(x) if f else x for x, f in zip(leaves, flags)])


def _frozen_or(is_leaf: Callable[[Any], bool] | None) -> Callable[[Any], bool]:
    if is_leaf is None:
        return is_frozen
    return lambda x: type(x) is _Frozen or is_leaf(x)
