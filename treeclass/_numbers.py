"""The one rule for a number put into an array: kept when the array holds it up to
rounding (Python numbers judged by value, NumPy scalars by kind too), then written as the
weak Python number of its value; else refused (`TypeError`, `NumberRangeError`), never
wrapped, clipped or made inf/nan. Dtype categories are JAX's (ml_dtypes included).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes  # a dependency of jax: the bfloat16, float8 and int4 scalar types
import numpy as np
from jax.typing import DTypeLike


class NumberRangeError(OverflowError, ValueError):
    """A number outside the range of the dtype of the array it is put into."""


_CATEGORIES = (
    ("b", jnp.bool_),
    ("i", jnp.signedinteger),
    ("u", jnp.unsignedinteger),
    ("f", jnp.floating),
    ("c", jnp.complexfloating),
)
# a number's kind -> the dtype kinds that take it, for numbers not judged by value alone
KIND_FITS = {"b": "b", "i": "iufc", "u": "iufc", "f": "fc", "c": "c"}


def _number_types() -> frozenset[type]:
    kinds: set[type] = {bool, int, float, complex}
    for kind in np.sctypeDict.values():  # np.timedelta64 is a duration, not a number
        if issubclass(kind, np.number | np.bool_) and not issubclass(kind, np.timedelta64):
            kinds.add(kind)
    for kind in vars(ml_dtypes).values():
        if isinstance(kind, type) and issubclass(kind, np.generic):
            kinds.add(kind)
    return frozenset(kinds)


# one C-level set lookup (`type(x) in NUMBER_TYPES`) on the hot paths of `.at` and stacks
NUMBER_TYPES = _number_types()
PYTHON_NUMBERS = (bool, int, float, complex)


def is_number(x: object) -> bool:
    """Whether `x` is a number: a Python or NumPy / ml_dtypes scalar of a number type."""
    return type(x) in NUMBER_TYPES


def number_repr(x: object) -> str:
    """`repr` of a number that names an ml_dtypes scalar's type (`2.5` alone would not)."""
    if type(x).__module__.startswith("ml_dtypes"):
        return f"ml_dtypes.{type(x).__name__}({x})"
    return repr(x)


def dtype_name(dtype: DTypeLike) -> str:
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype)


@functools.lru_cache(maxsize=256)  # dtypes are few and hashable; asked on every write
def dtype_kind(dtype: DTypeLike) -> str:
    """'b', 'i', 'u', 'f' or 'c' by JAX's categories; 'V' for the rest (PRNG keys)."""
    try:
        if jnp.issubdtype(dtype, jax.dtypes.prng_key):
            return "V"
        return next(kind for kind, category in _CATEGORIES if jnp.issubdtype(dtype, category))
    except (StopIteration, TypeError):
        return "V"


def number_kind(x: complex | np.generic) -> str:
    """The kind of a Python or NumPy (or ml_dtypes) number."""
    if isinstance(x, bool):
        return "b"
    if isinstance(x, int):
        return "i"
    if isinstance(x, float):
        return "f"
    if isinstance(x, complex):
        return "c"
    kind = dtype_kind(x.dtype)  # a NumPy scalar
    if kind == "V":  # an ml_dtypes type JAX has no category for (complex32): by its value
        kind = number_kind(x.item())
    return kind


def _plain(x: np.generic) -> complex:
    """A NumPy scalar as the Python number of its value (`np.longdouble` rounded to float64)."""
    item = x.item()
    if type(item) in PYTHON_NUMBERS:
        return item
    return complex(item) if isinstance(x, np.complexfloating) else float(item)


def plain_number(x: Any) -> Any:
    """A NumPy or ml_dtypes number as the Python number of its value; anything else as is."""
    return _plain(x) if type(x) in NUMBER_TYPES and isinstance(x, np.generic) else x


def jax_holdable(array: np.ndarray) -> np.ndarray:
    """A NumPy array as one JAX can hold: `np.longdouble` ones rounded to 64 bits."""
    if not _wide(array.dtype):
        return array
    return array.astype(np.complex128 if array.dtype.kind == "c" else np.float64)


def _overflowed(x: complex) -> bool:
    return type(x) is not int and (math.isinf(x.real) or math.isinf(x.imag))


def _wide(dtype: np.dtype) -> bool:
    """Whether `dtype` holds more than a Python float (a NumPy leaf of `np.longdouble`)."""
    return dtype.kind in "fc" and dtype.itemsize > (8 if dtype.kind == "f" else 16)


@functools.lru_cache(maxsize=256)
def _range_of(dtype: np.dtype) -> tuple[str, Any, Any, Any]:
    """`(kind, min, max, None)`, or for floats `(kind, half step at max, max, real dtype)`."""
    kind = dtype_kind(dtype)
    if kind == "b":
        return kind, 0, 1, None
    if kind in "iu":
        info = jnp.iinfo(dtype)
        return kind, int(info.min), int(info.max), None
    if kind in "fc":
        finfo = jnp.finfo(dtype)
        largest = float(finfo.max)
        half_step = math.ldexp(float(finfo.eps), math.frexp(largest)[1] - 2)
        return kind, half_step, largest, finfo.dtype
    return kind, None, None, None


@functools.lru_cache(maxsize=256)
def _signed_float(real: np.dtype) -> bool:
    """Whether a float dtype holds 0 and negative numbers (float8_e8m0fnu holds neither)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(np.asarray([0.0, -1.0]).astype(real)).all())


def plain_float_limit(dtype: np.dtype) -> float | None:
    """The bound below which a float dtype keeps every finite number (None: not a float)."""
    kind, _, largest, real = _range_of(dtype)
    return largest if kind == "f" and _signed_float(real) else None


def _float_misfit(
    part: float, name: str, largest: float, half_step: float, real: np.dtype
) -> str | None:
    try:
        exact = float(part)
    except OverflowError:  # an int too large for any float
        return f"{name} holds numbers up to ±{largest:.6g}"
    if abs(exact) < largest and _signed_float(real):
        return None  # the common case: kept up to rounding
    with np.errstate(over="ignore", invalid="ignore"):
        cast = np.asarray(exact).astype(real)  # the real dtype of a complex one
    if math.isnan(exact):
        return None if np.isnan(cast) else f"{name} has no nan (it would become {cast})"
    if math.isinf(exact):
        if np.isinf(cast) and (cast > 0) == (exact > 0):
            return None
        return f"{name} has no inf (it would become {cast})"
    if abs(exact) >= largest + half_step or not np.isfinite(cast):
        if abs(exact) > largest:
            return f"{name} holds numbers up to ±{largest:.6g} (it would become {cast})"
        return f"{name} has no value near it (it would become {cast})"
    return None


def number_misfit(value: Any, dtype: np.dtype) -> tuple[type[Exception], str] | None:
    """`(error type, why)` the number `value` would change in an array of `dtype`, or None."""
    kind, low, high, real = _range_of(dtype)
    name = dtype_name(dtype)
    if kind == "V":
        return TypeError, f"an array of dtype {name} holds no numbers"
    if isinstance(value, bool | np.bool_):
        if kind != "b":
            return TypeError, f"a bool is a flag, not a number of {name}'s kind"
        return None
    if isinstance(value, np.generic):
        if kind not in KIND_FITS.get(number_kind(value), ""):
            module = "ml_dtypes" if type(value).__module__.startswith("ml_dtypes") else "numpy"
            return TypeError, f"a `{module}.{type(value).__name__}` is not of {name}'s kind"
        plain = _plain(value)
        if _overflowed(plain) and np.isfinite(value) and not _wide(np.dtype(dtype)):
            # a finite np.longdouble beyond float64, and so beyond every dtype JAX holds
            return NumberRangeError, f"{name} holds numbers up to ±{high:.6g}"
        value = plain
    parts = [value.real, value.imag] if isinstance(value, complex) else [value]
    if kind != "c" and len(parts) == 2:
        if parts[1] != 0:
            return TypeError, f"a complex number with an imaginary part does not fit {name}"
        parts = parts[:1]
    if kind in "biu":
        part = parts[0]
        if isinstance(part, float) and not (math.isfinite(part) and part == int(part)):
            return TypeError, f"{part!r} is not an integer"
        if not low <= int(part) <= high:
            return NumberRangeError, f"{name} holds the integers {low} to {high}"
        return None
    for part in parts:
        reason = _float_misfit(part, name, high, low, real)
        if reason is not None:
            return NumberRangeError, reason
    return None


def number_value(value: Any, dtype: DTypeLike) -> Any:
    """The weak Python number of the array's kind to write for `value` into `dtype`."""
    if isinstance(value, np.generic):
        if _wide(np.dtype(dtype)):
            return value
        value = _plain(value)
    kind = dtype_kind(dtype)  # type: ignore[arg-type]  # every dtype the callers pass hashes
    if kind in "iu":
        value = int(value.real if type(value) is complex else value)
        if not -(2**31) <= value < 2**31:
            # beyond what a weak int carries without x64 (a high uint32): as the dtype's own
            return np.dtype(dtype).type(value)
        return value
    if kind == "b":
        return bool(value)
    if kind == "f" and type(value) is complex:
        return value.real
    if type(value) is int and kind in "fc":
        return float(value)  # a weak int carries only int32's range without x64
    return value
