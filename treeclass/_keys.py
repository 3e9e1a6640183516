"""Exact keys for values that live in a tree definition: static fields and frozen values.

A value stored in a tree definition (a static field, or a frozen value) decides which
`jax.jit` trace a call reuses, so two values may share a key only when a computation that
bakes either in as a constant would be the same. Python's own `==` is too coarse for that:
`1 == 1.0 == True`, `0.0 == -0.0`, `np.float64(0.0) == 0.0`, and `nan != nan`. A key here is
the value's exact type plus its value, floats by their bits, containers by the keys of their
items, so:

- values of different types never share a key (`1`, `1.0`, `True`, `np.int32(1)`);
- `0.0` and `-0.0` differ, in Python floats, complex numbers, NumPy scalars and inside tuples;
- a NaN equals a NaN with the same bits (as frozen arrays compare), so a fresh
  `float("nan")` does not force a new trace on every call.
"""

from __future__ import annotations

import numbers
import struct
from typing import Any

import numpy as np

__all__ = ["value_key", "PLAIN_TYPES", "ByIdentity"]

# types whose values are their own exact keys, next to their type (`(type(v), v)`)
PLAIN_TYPES = frozenset({int, str, bool, bytes, type(None), type(Ellipsis)})
_PLAIN = PLAIN_TYPES
_pack_double = struct.Struct("<d").pack


def _float_key(kind: type, value: float) -> tuple[Any, ...]:
    if value == value and value != 0.0:  # the common case: the value says it all
        return (kind, value)
    return (kind, _pack_double(value))  # zeros and NaNs: their bits carry the sign


def value_key(value: Any) -> Any:
    """A hashable key, equal for two values exactly when they are interchangeable.

    Raises `TypeError` for an unhashable value (after looking inside tuples and frozensets,
    so the error names the unhashable item's type).
    """
    kind = type(value)
    if kind in _PLAIN:
        return (kind, value)
    if kind is float:
        return _float_key(kind, value)
    if isinstance(value, tuple):  # tuples, namedtuples: the class is part of the key
        return (kind, tuple(map(value_key, value)))
    if kind is frozenset:
        return (kind, frozenset(map(value_key, value)))
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


class ByIdentity:
    """The key of a value with no equality we can trust (an array, say): its identity."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return type(other) is ByIdentity and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)
