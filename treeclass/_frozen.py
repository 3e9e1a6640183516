"""Frozen values: a value wrapped in a pytree node without children.

`jax.jit` treats it as static (its tree definition is part of the cache key), so its
exact key and hash are computed once, when frozen, and equality checks identity first.
It describes itself through its row (a wrapper marked `#`) and `_values`'s display.
"""

from __future__ import annotations

import copy
import re
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import numpy as np

from ._structure import NodeKind, Wrapper, register_kind
from ._values import (
    display,
    exact_key,
    readable_here,
    register_childless,
    sharding_spec,
    short_repr,
    size_text,
)

_T = TypeVar("_T")

_OPERATION_ON_FROZEN = (
    "cannot compute `{expr}` with the frozen value x = {value}: a frozen value is hidden from "
    "JAX and supports no operations or calls. Unfreeze it first:\n"
    "    before: {expr}\n"
    "    after:  {fixed}\n"
    "or unfreeze a whole tree with `tc.tree_unmask(tree)` inside the transformed function."
)
_IMMUTABLE = "a frozen value is immutable; use `tc.unfreeze` to get the value"
_ATTRIBUTE_OF_FROZEN = (
    "a frozen value has no attribute {name!r}; the value inside it may. Unfreeze it first:\n"
    "    before: x.{name}\n"
    "    after:  tc.unfreeze(x).{name}"
)


class Frozen:
    """A value wrapped in a pytree node without children (see `freeze`).

    It answers `.shape`, `.dtype`, `.ndim` and `.size` of the value inside (when that
    value has them); everything else needs `tc.unfreeze`.
    """

    __slots__ = ("_value", "_key", "_hash")

    def __init__(self, value: object) -> None:
        key = exact_key(value)
        object.__setattr__(self, "_value", value)
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_hash", hash(key))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not Frozen:
            return NotImplemented
        if self._hash != other._hash:
            return False
        try:
            return bool(self._key == other._key)
        except Exception:  # a value whose `==` has no truth value (elementwise, say)
            return False

    # `#` + x's tree repr everywhere, from the printers (floors above) through `_values`
    def __repr__(self) -> str:
        return display("repr", self)

    def __str__(self) -> str:
        return display("str", self)

    def __treescope_repr__(self, path: str | None, subtree_renderer: object) -> Any:
        # called by treescope only, once it is imported; we never import it ourselves
        return display("treescope", self, path, subtree_renderer)

    # an array's description, read without unfreezing; any computation needs the value
    shape = property(lambda self: self._described("shape"))
    dtype = property(lambda self: self._described("dtype"))
    ndim = property(lambda self: self._described("ndim"))
    size = property(lambda self: self._described("size"))

    def _described(self, name: str) -> Any:
        try:
            return getattr(self._value, name)
        except AttributeError:
            raise AttributeError(_ATTRIBUTE_OF_FROZEN.format(name=name)) from None

    def __getattr__(self, name: str) -> Any:
        # only reached for missing attributes; protocol probes (`__array_priority__`, ...)
        # get the plain error they expect
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(_ATTRIBUTE_OF_FROZEN.format(name=name))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(_IMMUTABLE)

    def __delattr__(self, name: str) -> None:
        raise AttributeError(_IMMUTABLE)

    def __copy__(self) -> Frozen:
        return self

    def __deepcopy__(self, memo: dict) -> Frozen:
        return Frozen(copy.deepcopy(self._value, memo))

    def __reduce__(self) -> tuple:
        # the hash is recomputed on load: str hashes differ between processes
        return (freeze, (self._value,))


class FrozenOperationError(NotImplementedError, TypeError):
    """An operation on a frozen value: a `NotImplementedError` (PyTreeClass) and `TypeError`."""


def _refuse(expr: str) -> Callable[..., Any]:
    fixed = re.sub(r"\bx\b", "tc.unfreeze(x)", expr)

    def method(self: Frozen, *args: object, **kwargs: object) -> Any:
        raise FrozenOperationError(
            _OPERATION_ON_FROZEN.format(expr=expr, fixed=fixed, value=short_repr(self))
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
    setattr(Frozen, _name, _refuse(_expr))
del _name, _expr


register_childless(Frozen)


class _FrozenKind(NodeKind[Frozen]):
    """The row of a frozen value: a node without children standing for its value."""

    wrapper: Wrapper[Frozen, Any] = Wrapper(
        "#", lambda x: x._value, "a frozen value", "frozen", "freeze", lambda _, x: _refreeze(x)
    )


def _refreeze(x: object) -> Frozen:
    """`freeze` without the size warning, for a value frozen once already."""
    _refuse_spread_arrays(x)
    return Frozen(snapshot(x))


register_kind(Frozen, _FrozenKind())


class FrozenArrayWarning(UserWarning):
    """`tc.freeze` of more than 1 MiB of arrays, a constant of every program `jax.jit`
    compiles with it: for pretrained weights declare the field `tc.field(role="frozen")`.

    ```python
    import warnings, jax.numpy as jnp
    import treeclass as tc

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tc.freeze(jnp.zeros((1024, 1024)))   # 4 MiB: a constant of every program
    assert [w.category for w in caught] == [tc.FrozenArrayWarning]
    ```
    """


# 1 MiB: far above the flags, functions and small tables code freezes on purpose, far
# below a pretrained layer
LARGE_FROZEN_BYTES = 1 << 20

# the fix for pretrained weights frozen whole (shared with the stacks' message)
FROZEN_FIELD_FIX = (
    "    before: self.base = tc.freeze(base)\n"
    '    after:  base: Linear = tc.field(role="frozen")  # in the class body\n'
    "            self.base = base                               # in __init__"
)
_LARGE_FROZEN_MSG = (
    "tc.freeze of {size} of arrays: a frozen value is a constant of every jitted program "
    "that takes it (hashed, inlined, compiled anew for new values, kept alive by the jit "
    "cache). For pretrained weights, keep them ordinary leaves in a field declared "
    "frozen, which jax.jit traces, jax.grad gives zeros and tc.optim.trainable never "
    "trains:\n" + FROZEN_FIELD_FIX
)


def _array_bytes(x: object) -> int:
    leaves = (x,) if isinstance(x, (jax.Array, np.ndarray)) else jax.tree_util.tree_leaves(x)
    arrays = [a for a in leaves if isinstance(a, (jax.Array, np.ndarray)) and a.dtype != object]
    return sum(int(a.size) * a.dtype.itemsize for a in arrays)


def freeze(x: _T) -> _T:
    """Wrap `x` in a node without children, so JAX transformations do not see it.

    The frozen value is static under `jax.jit`, carried unchanged through `jax.grad`,
    `jax.vmap` and optax, and refuses arithmetic and calls (`FrozenOperationError`) until
    unfrozen. Freezing is idempotent and takes a snapshot; equality is exact (the masking
    guide says how). More than 1 MiB of arrays warns (`tc.FrozenArrayWarning`).

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
    if type(x) is Frozen:
        return x
    _refuse_spread_arrays(x)
    size = _array_bytes(x)
    if size > LARGE_FROZEN_BYTES:
        warnings.warn(
            _LARGE_FROZEN_MSG.format(size=size_text(size)), FrozenArrayWarning, stacklevel=2
        )
    # typed as `x`'s own type: a field keeps the annotation of what it holds
    return Frozen(snapshot(x))  # type: ignore[return-value]


FROZEN_SPREAD_MSG = (
    "cannot freeze a jax.Array placed on devices of several processes (sharding {spec}). "
    "A frozen value is part of the tree's structure: `jax.jit` closes over it, and JAX "
    "refuses to close over an array that spans other processes' devices unless it is "
    "replicated everywhere. Freeze a copy every process "
    "holds whole: replicated over the mesh, or a NumPy array on the host:\n"
    "    before: tc.freeze(table)\n"
    "    after:  tc.freeze(jax.device_put(table, NamedSharding(mesh, P())))"
)


def _refuse_spread_arrays(x: object) -> None:
    # many hosts (`jax.distributed`): such an array would fail later, in `jit`, unnamed
    leaves = (x,) if isinstance(x, jax.Array) else jax.tree_util.tree_leaves(x)
    for leaf in leaves:
        if not readable_here(leaf):
            raise ValueError(FROZEN_SPREAD_MSG.format(spec=sharding_spec(leaf)))


def _copy_array(x: Any) -> Any:
    # any NumPy array may change under us (a view, a flag set back): each gets a private
    # read-only copy; object arrays are keyed by identity (their bytes are pointers)
    if isinstance(x, np.ndarray) and x.dtype != object:
        x = x.copy()
        x.flags.writeable = False
    return x


def snapshot(x: object) -> Any:
    """`x` as it is now, NumPy arrays copied (read-only) and containers rebuilt."""
    if isinstance(x, np.ndarray):
        return _copy_array(x)
    if isinstance(x, (jax.Array, str, bytes, int, float, complex, np.generic)) or x is None:
        return x
    try:
        leaves, treedef = jax.tree_util.tree_flatten(x, is_leaf=is_frozen)
        if treedef.num_nodes == 1:  # a leaf (a function, an object): nothing to rebuild
            return x
        return treedef.unflatten([_copy_array(leaf) for leaf in leaves])
    except Exception:  # not a pytree we can take apart and rebuild: keep it as it is
        return x


def unfreeze(x: _T) -> _T:
    """The value inside a frozen `x`; any other `x` is returned unchanged.

    ```python
    import treeclass as tc

    assert tc.unfreeze(tc.freeze("relu")) == "relu"
    assert tc.unfreeze(1.0) == 1.0
    ```
    """
    if isinstance(x, Frozen):  # (`type(x) is` would not narrow a type variable for mypy)
        return x._value
    return x


def is_frozen(x: object) -> bool:
    """Whether `x` was made by `freeze`.

    ```python
    import treeclass as tc

    assert tc.is_frozen(tc.freeze(1)) and not tc.is_frozen(1)
    ```
    """
    return type(x) is Frozen
