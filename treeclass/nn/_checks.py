"""Argument checks every layer shares (when built; the input's feature size when called):
each error names the layer, the argument, the value and what was expected."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

_ARGUMENT_MSG = "`{layer}({name}=...)` must be {expected}; got {value!r}."
_INPUT_MSG = "`{layer}` takes {what} of shape {expected}; got one of shape {shape}."
_INTEGER_MSG = "`{layer}` takes integer {what}, got an array of dtype {dtype}."


def _int_or_none(value: object) -> int | None:
    # NumPy and JAX integer scalars count (operator.index); a bool is not a size
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def _int_expected(minimum: int) -> str:
    return {0: "an int >= 0", 1: "a positive int"}.get(minimum, f"an int >= {minimum}")


def _bad(error: type[Exception], layer: str, name: str, expected: str, value: object) -> Exception:
    return error(_ARGUMENT_MSG.format(layer=layer, name=name, expected=expected, value=value))


def check_int(layer: str, name: str, value: object, *, minimum: int = 1) -> int:
    """`value` as an `int >= minimum`, else a `TypeError` or `ValueError` naming it."""
    number = _int_or_none(value)
    if number is None or number < minimum:
        error = TypeError if number is None else ValueError
        raise _bad(error, layer, name, _int_expected(minimum), value)
    return number


def check_ints(
    layer: str, name: str, value: object, n: int, *, minimum: int = 1
) -> tuple[int, ...]:
    """An int or a sequence of `n` ints (one per axis), each `>= minimum`, as a tuple."""
    expected = f"{_int_expected(minimum)}, or a tuple of {n} (one per axis)"
    if _int_or_none(value) is not None:
        values: Sequence[object] = (value,) * n
    elif isinstance(value, Sequence) and not isinstance(value, str) and len(value) == n:
        values = value
    else:
        values = [None]
    numbers = [_int_or_none(v) for v in values]
    if any(v is None for v in numbers):
        raise _bad(TypeError, layer, name, expected, value)
    if any(v < minimum for v in numbers):  # type: ignore[operator]
        raise _bad(ValueError, layer, name, expected, value)
    return tuple(numbers)  # type: ignore[arg-type]


def check_number(
    layer: str,
    name: str,
    value: object,
    *,
    low: float = -math.inf,
    high: float = math.inf,
    open_low: bool = False,
    open_high: bool = False,
) -> float:
    """`value` as a `float` in the interval `low`..`high` (closed unless `open_*`; no NaN)."""
    left, right = "(" if open_low else "[", ")" if open_high else "]"
    if math.isinf(low) and math.isinf(high):
        expected = "a finite number"
    elif math.isinf(high):
        expected = f"a number {'>' if open_low else '>='} {low:g}"
    else:
        expected = f"a number in {left}{low:g}, {high:g}{right}"
    try:
        if isinstance(value, bool | str | bytes):  # float() would read these
            raise TypeError
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # not a number, or an array of several elements
        raise _bad(TypeError, layer, name, expected, value) from None
    above = number > low if open_low else number >= low
    below = number < high if open_high else number <= high
    if not (math.isfinite(number) and above and below):
        raise _bad(ValueError, layer, name, expected, value)
    return number


def check_input(
    layer: str,
    x: Any,
    name: str,
    size: int | None,
    *,
    leading: str = "...",
    trailing: Sequence[str] = (),
    ndim: int = 1,
    what: str = "inputs",
) -> None:
    """A `ValueError` unless `x` has at least `ndim` axes and the one before the axes named
    `trailing` (none: its last) is `size` (any, when `size` is None: a sublayer that does
    not say its sizes)."""
    if size is None:
        return
    shape = x.shape if hasattr(x, "shape") else jnp.shape(x)
    axis = len(shape) - 1 - len(trailing)
    if len(shape) < ndim or axis < 0 or shape[axis] != size:
        expected = f"({', '.join([leading, f'{name}={size}', *trailing])})"
        text = _INPUT_MSG.format(layer=layer, what=what, expected=expected, shape=tuple(shape))
        raise ValueError(text)


def check_integers(layer: str, what: str, x: object) -> jax.Array:
    """`x` as an array, else a `TypeError` naming the layer if its dtype is not an integer."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise TypeError(_INTEGER_MSG.format(layer=layer, what=what, dtype=x.dtype))
    return x
