"""Value facts: what every other module asks of a single value (exact keys, host bytes,
texts for messages, the display protocol), answered once. It imports nothing of treeclass.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import numbers
import struct
import types
from collections.abc import Callable, Hashable, Iterable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from jax.tree_util import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey
from jax.typing import ArrayLike, DTypeLike

__all__ = [
    "PLAIN_TYPES",
    "ByIdentity",
    "register_childless",
    "exact_key",
    "hashable_key",
    "is_array",
    "readable_here",
    "local_copy",
    "sharding_spec",
    "host_bytes",
    "is_prng_key",
    "is_bool_mask_leaf",
    "is_inexact_array",
    "short_repr",
    "size_text",
    "array_type",
    "closest",
    "root_name",
    "path_str",
    "entry_name",
    "display",
    "offer_display",
]

# types whose values are their own exact keys, next to their type (`(type(v), v)`)
PLAIN_TYPES = frozenset({int, str, bool, bytes, type(None), type(Ellipsis)})
# functions are keyed by their own `==`/hash, told by type ahead of the slow checks (not
# bound methods: they hash their object, which may be unhashable)
_FUNCTIONS = frozenset({types.FunctionType, np.ufunc, type(jnp.add)})
_pack_double = struct.Struct("<d").pack


class ByIdentity:
    """The key of a value with no equality we can trust (a tracer, say): its identity."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return type(other) is ByIdentity and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)


def is_array(x: object) -> bool:
    """Whether `x` is a JAX array (a tracer too) or a NumPy array (not a NumPy scalar)."""
    return isinstance(x, (jax.Array, np.ndarray))


def readable_here(x: object) -> bool:
    """Whether this process can read `x` alone (not a `jax.Array` split across processes)."""
    if not isinstance(x, jax.Array) or isinstance(x, Tracer):
        return True
    try:
        return x.is_fully_addressable or x.is_fully_replicated
    except Exception:  # a deleted (donated) buffer still has a sharding, but be safe
        return True


def local_copy(x: object) -> Any:
    """`x`, or this process's own copy of it when it is replicated over other processes."""
    if isinstance(x, jax.Array) and not isinstance(x, Tracer) and not x.is_fully_addressable:
        return x.addressable_data(0)
    return x


def sharding_spec(x: jax.Array) -> Any:
    """The partition spec of `x`'s sharding (or the sharding, where it has none)."""
    return getattr(x.sharding, "spec", x.sharding)


def is_prng_key(x: object) -> bool:
    """Whether `x` is a typed PRNG key array (`jax.random.key`), concrete or abstract."""
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key)


@functools.cache
def _is_inexact_dtype(dtype: DTypeLike) -> bool:
    # jax.dtypes knows bfloat16 & co. and the extended (key) dtypes; numpy does not
    return bool(jnp.issubdtype(dtype, np.inexact))


def is_inexact_array(x: object) -> bool:
    """Whether `x` is a floating or complex array or NumPy scalar (also an abstract one)."""
    if isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)):
        return _is_inexact_dtype(x.dtype)
    return False


def is_bool_mask_leaf(x: object) -> bool:
    """Whether `x` can be a leaf of a bool mask tree: a bool, or a concrete bool scalar array."""
    if isinstance(x, (bool, np.bool_)):
        return True
    return (
        isinstance(x, (jax.Array, np.ndarray))
        and not isinstance(x, Tracer)
        and x.shape == ()
        and x.dtype == np.bool_
    )


def host_bytes(array: ArrayLike) -> np.ndarray:
    """The array's bytes on the host as a flat uint8 view (`TypeError` for object arrays)."""
    if is_prng_key(array):
        array = jax.random.key_data(array)
    host = np.asarray(array)
    if host.dtype == object:
        raise TypeError("object arrays have no value bytes")
    return np.ascontiguousarray(host).reshape(-1).view(np.uint8)


class ArrayKey:
    """Key of an array: its metadata and a digest of its bytes, confirmed by the bytes."""

    __slots__ = ("array", "meta", "digest", "hash")

    def __init__(
        self, array: jax.Array | np.ndarray, meta: tuple[Any, ...], host: np.ndarray
    ) -> None:
        self.array = array
        self.meta = meta
        self.digest = hashlib.blake2b(host.data, digest_size=16).digest()
        self.hash = hash((meta, self.digest))

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not ArrayKey:
            return False
        if self.hash != other.hash or self.meta != other.meta or self.digest != other.digest:
            return False
        # bitwise (NaN equals the same NaN, 0.0 is not -0.0), as a baked-in constant would be
        return bool(np.array_equal(host_bytes(self.array), host_bytes(other.array)))


def _array_key(array: jax.Array | np.ndarray) -> Any:
    if isinstance(array, Tracer):
        return ByIdentity(array)
    try:
        host = host_bytes(array)
    except Exception:  # an object array, or one sharded over devices we cannot read
        return ByIdentity(array)
    meta = (type(array), array.shape, str(array.dtype), bool(getattr(array, "weak_type", False)))
    return ArrayKey(array, meta, host)


def _no_children(node: object) -> tuple[tuple[()], object]:
    return (), node


def _itself(node: object, children: object) -> object:
    return node


def register_childless(cls: type) -> None:
    """Register `cls` with JAX as a node without children, its own (static) auxiliary data."""
    jax.tree_util.register_pytree_with_keys(cls, _no_children, _itself, _no_children)


def _float_key(kind: type, value: float) -> tuple[Any, ...]:
    if value == value and value != 0.0:  # the common case: the value says it all
        return (kind, value)
    return (kind, _pack_double(value))  # zeros and NaNs: their bits carry the sign


def hashable_key(value: Any) -> Any:
    """`exact_key` of a value that must be hashable (`TypeError` if not, arrays included)."""
    kind = type(value)
    if kind in PLAIN_TYPES:
        return (kind, value)
    if kind is float:
        return _float_key(kind, value)
    if isinstance(value, tuple):  # tuples, namedtuples: the class is part of the key
        return (kind, tuple(map(hashable_key, value)))
    if kind is frozenset:
        return (kind, frozenset(map(hashable_key, value)))
    if isinstance(value, np.generic):
        # the dtype string tells datetime units apart; the bytes tell -0.0 from 0.0
        return (kind, value.dtype.str, value.tobytes())
    if isinstance(value, complex):
        return (kind, _float_key(float, value.real), _float_key(float, value.imag))
    if isinstance(value, float):  # a float subclass
        return (kind, _float_key(float, float(value)))
    hash(value)  # raises TypeError for an unhashable value
    if isinstance(value, numbers.Number) and not isinstance(value, numbers.Integral):
        # Decimal('-0') == Decimal('0'); the repr keeps the sign
        return (kind, value, repr(value))
    return (kind, value)


def _leaf_key(leaf: object) -> Any:
    try:
        return hashable_key(leaf)
    except TypeError:
        return ByIdentity(leaf)


def exact_key(value: Any) -> Any:
    """A hashable key, equal for two values exactly when they are interchangeable.

    Python's `==` is too coarse (`1 == 1.0 == True`, `0.0 == -0.0`, `nan != nan`): values of
    different types never share a key, zeros differ by sign, a NaN equals a NaN of the same
    bits. Arrays are keyed by type, shape, dtype, weak type and bytes; tracers and arrays
    this process cannot read by identity; a pytree by its structure and its leaves' keys
    (so distinct equal subtrees are equal); anything else unhashable by identity. Never
    raises.
    """
    kind = type(value)
    if kind in PLAIN_TYPES or kind is float:  # `hashable_key`'s first cases: exact and quick
        return hashable_key(value)
    if kind in _FUNCTIONS:
        return (kind, value)
    if isinstance(value, (jax.Array, np.ndarray)):
        return _array_key(value)
    if isinstance(value, (np.generic, complex, float)):
        return _leaf_key(value)
    try:
        leaves, treedef = jax.tree_util.tree_flatten(value)
    except Exception:  # a broken flatten: not a tree we can look into
        return _leaf_key(value)
    if treedef.num_nodes == 1 and treedef.num_leaves == 1:
        return _leaf_key(value)
    key = (treedef, tuple(map(exact_key, leaves)))
    try:
        hash(key)
    except TypeError:  # unhashable node data
        return ByIdentity(value)
    return key


def short_repr(x: object, limit: int | None = 40, show: Callable[[object], str] = repr) -> str:
    """`show(x)` on one line cut to `limit` characters (whole with None); never raises."""
    if x is Ellipsis:  # a placeholder in `tc.Partial` arguments and selectors
        return "..."
    try:
        text = show(x)
    except Exception as error:  # a broken repr must not hide the real error
        return f"<{type(x).__name__} object (repr failed: {type(error).__name__})>"
    if limit is None:
        return text
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


_N = TypeVar("_N")

# `float32` -> `f32`, `bfloat16` -> `bf16`: dtypes as the printers show them
_DTYPE_PREFIXES = (("bfloat", "bf"), ("complex", "c"), ("float", "f"), ("uint", "u"), ("int", "i"))


def array_type(dtype: object, shape: tuple[int, ...]) -> str:
    """An array's type as every printer and message writes it: `f32[3,4]`, `bool[]`."""
    name = str(dtype)
    for long, short in _DTYPE_PREFIXES:
        if name.startswith(long):
            name = short + name[len(long) :]
            break
    return f"{name}[{','.join(map(str, shape))}]"


_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def size_text(size: int) -> str:
    """A size in bytes as the printers and messages write it: `24B`, `2.00MiB`."""
    if size < 1024:
        return f"{size}B"
    unit = min((size.bit_length() - 1) // 10, len(_UNITS) - 1)  # exact: no float log
    if unit + 1 < len(_UNITS) and round(size / 1024**unit, 2) >= 1024:  # 1023.999 KiB
        unit += 1
    return f"{size / 1024**unit:.2f}{_UNITS[unit]}"


def closest(name: object, names: Iterable[_N]) -> _N | None:
    """The one of `names` closest to `name` as text (a likely typo's intent), or `None`."""
    texts = {str(n): n for n in names}
    found = difflib.get_close_matches(str(name), list(texts), n=1)
    return texts[found[0]] if found else None


def root_name(root: object) -> str:
    """How messages name the root of a tree: its class, or `tree` for builtins."""
    cls = type(root)
    return "tree" if cls.__module__ == "builtins" else cls.__name__


def path_str(root: object, path: Iterable[Hashable]) -> str:
    """A key path as text, prefixed by the root's name: `MLP.layers[0].weight`."""
    return root_name(root) + jax.tree_util.keystr(tuple(path))


def entry_name(entry: Any) -> Any:
    """The name a key entry stands for: attribute name, dict key, or sequence index."""
    cls = type(entry)  # JAX's four key types by identity first: every walk asks this
    if cls is GetAttrKey:
        return entry.name
    if cls is DictKey or cls is FlattenedIndexKey:
        return entry.key
    if cls is SequenceKey:
        return entry.idx
    for attribute in ("name", "key", "idx"):
        if hasattr(entry, attribute):
            return getattr(entry, attribute)
    return entry


# The printers (floors above) offer themselves here when they load; a low value (a frozen
# value's `__repr__`) asks `display(format, value)`.

_DISPLAYS: dict[str, Any] = {}


def offer_display(fmt: str, printer: object) -> None:
    """Make `printer(value, *args)` the way values are shown in format `fmt`."""
    _DISPLAYS[fmt] = printer


def display(fmt: str, value: object, *args: Any) -> Any:
    """Show `value` in format `fmt` (`"repr"`, `"str"`, `"treescope"`) with the printers."""
    printer = _DISPLAYS.get(fmt)
    if printer is None:  # the printers have not loaded (only while treeclass imports)
        return object.__repr__(value)
    return printer(value, *args)
