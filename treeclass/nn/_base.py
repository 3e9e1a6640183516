"""What every layer shares: the `Layer` base class, dtypes and the initialisers (their
policy, equinox's and PyTorch's, is in README.md beside this file)."""

from __future__ import annotations

import math
from typing import Any, overload

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.core import Tracer
from jax.typing import ArrayLike, DTypeLike

from .._fields import field, fields
from .._node import child_names, children
from .._pprint_registry import register_printer
from .._treeclass import TreeClass

_DTYPE_MSG = (
    "`{where}` must be a floating dtype (such as jnp.float32 or jnp.bfloat16) or None, "
    "got {value!r}."
)
_KEY_MSG = (
    "`{layer}(...)` needs `key=`, a PRNG key to draw its initial weights from, got {value!r}. "
    "Write\n    {layer}(..., key=jax.random.key(0))"
)


@overload
def dtype_name(value: None, where: str) -> None: ...
@overload
def dtype_name(value: DTypeLike, where: str) -> str: ...
def dtype_name(value: DTypeLike | None, where: str) -> str | None:
    """The name of a floating dtype (`"bfloat16"`), or `None`: static fields hold names."""
    if value is None:
        return None
    try:
        dtype = jnp.dtype(value)
    except TypeError:
        raise TypeError(_DTYPE_MSG.format(where=where, value=value)) from None
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(_DTYPE_MSG.format(where=where, value=value))
    return dtype.name


def dtype_field() -> Any:
    """A layer's static compute dtype: a dtype's name, or `None` (the default)."""
    return field(default=None, static=True, on_setattr=[lambda v: dtype_name(v, "dtype")])


def check_key(key: object, layer: str) -> jax.Array:
    """`key` if it is a PRNG key (typed or raw), else a `TypeError` naming the layer."""
    if isinstance(key, jax.Array) and (
        jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
        or (key.dtype == jnp.uint32 and key.shape[-1:] in ((2,), (4,)))
    ):
        return key
    raise TypeError(_KEY_MSG.format(layer=layer, value=key))


def fan_in_params(
    layer: str, key: object, shape: tuple[int, ...], use_bias: bool, param_dtype: DTypeLike
) -> dict[str, jax.Array | None]:
    """A `weight` of `shape` and a `bias` of `shape[0]` (or None) drawn by `layer` from
    `uniform(±1/sqrt(fan_in))`, `fan_in` the product of `shape[1:]`."""
    param_dtype = dtype_name(param_dtype, "param_dtype")
    limit = 1.0 / math.sqrt(math.prod(shape[1:]))
    wkey, bkey = jax.random.split(check_key(key, layer))
    weight = jax.random.uniform(wkey, shape, param_dtype, -limit, limit)
    bias = jax.random.uniform(bkey, shape[:1], param_dtype, -limit, limit) if use_bias else None
    return {"weight": weight, "bias": bias}


def normal_weight(
    layer: str, key: object, shape: tuple[int, ...], param_dtype: DTypeLike, stddev: float = 1.0
) -> jax.Array:
    """A weight of `shape` drawn by `layer` from `normal(0, stddev)` (embeddings, tokens)."""
    param_dtype = dtype_name(param_dtype, "param_dtype")
    weight = jax.random.normal(check_key(key, layer), shape, param_dtype)
    return weight if stddev == 1.0 else stddev * weight


def assign(layer: TreeClass, **values: object) -> None:
    """`setattr` on a layer under construction (type checkers refuse `self.weight = ...`)."""
    for name, value in values.items():
        setattr(layer, name, value)


def named(x: jax.Array, name: str) -> jax.Array:
    """`x` named for a rematerialisation policy (`save_only_these_names`) where it is traced;
    eagerly (no policy can see it) `x` itself, with no dispatch of the naming primitive."""
    return checkpoint_name(x, name) if isinstance(x, Tracer) else x


def cast(dtype: DTypeLike | None, *arrays: ArrayLike | None) -> Any:
    """`arrays` in the compute `dtype` (unchanged when it is `None`); `None`s stay `None`."""
    if dtype is None:
        return arrays
    return tuple(None if a is None else jnp.asarray(a, dtype) for a in arrays)


class Layer(TreeClass):
    """The base class of the layers of `treeclass.nn`: a `TreeClass` that prints compactly,
    showing its arrays and sublayers and only the static fields that differ from their
    default (`Conv(weight=..., bias=..., stride=(2, 2))`). Subclass it for your layers.

    ```python
    import jax
    import treeclass as tc

    layer = tc.nn.Linear(3, 4, key=jax.random.key(0))
    assert isinstance(layer, tc.nn.Layer)
    assert "dtype" not in repr(layer)  # at its default: not shown
    assert "dtype='bfloat16'" in repr(layer.replace(dtype="bfloat16"))
    ```
    """


def _children(layer: Layer) -> list[tuple[Any, Any]]:
    # what JAX sees; the configuration goes in the name, so summary rows stay the leaves
    names, values = child_names(layer), children(layer)
    return [(jax.tree_util.GetAttrKey(n), v) for n, v in zip(names, values, strict=True)]


def _type_name(layer: Layer) -> str:
    # the name, then the static fields whose value is not their default
    changed = []
    for spec in fields(layer):
        if spec.static and spec.repr:
            value = getattr(layer, spec.name, None)
            if not (spec.has_default and _same(value, spec.default)):
                # a function (an activation) by its name: its repr holds an address
                label = getattr(value, "__name__", None) if callable(value) else None
                changed.append(f"{spec.name}={repr(value) if label is None else label}")
    name = type(layer).__name__
    return f"{name}[{', '.join(changed)}]" if changed else name


def _same(value: object, default: object) -> bool:
    # a per-axis tuple equals a scalar default when every entry does: `stride=(1, 1)` is
    # the default `1`, `padding=((0, 0), (0, 0))` the default `0`
    if isinstance(value, tuple) and not isinstance(default, tuple):
        return all(_same(v, default) for v in value)
    try:
        return type(value) is type(default) and bool(value == default)
    except Exception:  # a value whose `==` is not a plain bool: shown
        return False


register_printer(Layer, children=_children, type_name=_type_name)
