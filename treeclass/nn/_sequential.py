"""`Sequential` and `MLP`: layers applied in turn (plain functions between them are kept
frozen, out of JAX's sight)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from .._fields import field
from .._frozen import freeze
from .._structure import TREECLASS, is_wrapper, row_of, unwrap
from ._base import Layer, assign, check_key
from ._checks import check_input, check_int
from ._linear import Linear

_NOT_CALLABLE_MSG = "`Sequential` layer {index} is not callable: got a {type}."


@functools.lru_cache(maxsize=1024)
def _takes_key(call: Callable[..., Any]) -> bool:
    # a class's `__call__` is fixed: asked once per class (speed only)
    try:
        return "key" in inspect.signature(call).parameters
    except (TypeError, ValueError):
        return False


class Sequential(Layer):
    """Layers called in turn: `Sequential(a, b, c)(x)` is `c(b(a(x)))`.

    A layer is any callable; a plain function (an activation) is kept frozen. `key=` is
    split among the layers whose `__call__` takes a `key` (`Dropout`, or yours), one each.
    `seq[i]` is layer `i` (a slice gives a `Sequential`); `len` and iteration work as for a
    tuple. Its one field, `layers`, is the tuple of the layers.

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    k1, k2 = jax.random.split(jax.random.key(0))
    model = tc.nn.Sequential(
        tc.nn.Linear(3, 8, key=k1), jax.nn.relu, tc.nn.Dropout(0.1), tc.nn.Linear(8, 1, key=k2)
    )
    y = model(jnp.ones((4, 3)), key=jax.random.key(1))
    assert y.shape == (4, 1) and len(model) == 4 and model[1] is jax.nn.relu
    ```
    """

    layers: tuple[Any, ...]

    def __init__(self, *layers: object) -> None:
        kept = []
        for index, layer in enumerate(layers):
            if not callable(layer) and not is_wrapper(layer):
                raise TypeError(_NOT_CALLABLE_MSG.format(index=index, type=type(layer).__name__))
            plain = row_of(layer).kind != TREECLASS and not is_wrapper(layer)
            kept.append(freeze(layer) if plain else layer)
        assign(self, layers=tuple(kept))

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self) -> Iterator[Any]:
        return (unwrap(layer) for layer in self.layers)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return type(self)(*self.layers[index])
        return unwrap(self.layers[index])

    def __call__(self, x: object, *, key: jax.Array | None = None) -> Any:
        """Each layer applied to the previous one's output."""
        layers = [unwrap(layer) for layer in self.layers]
        keyed = [row_of(a).kind == TREECLASS and _takes_key(type(a).__call__) for a in layers]
        keys = iter(jax.random.split(key, sum(keyed))) if key is not None and any(keyed) else None
        for layer, takes_key in zip(layers, keyed, strict=True):
            x = layer(x, key=next(keys)) if keys and takes_key else layer(x)
        return x


def _identity(x: object) -> Any:
    return x


class MLP(Layer):
    """A multilayer perceptron: `depth` hidden layers of `hidden_features`, an activation
    after each, then a `Linear` to `out_features` (and `final_activation`), built as
    `equinox.nn.MLP` builds it (the same key gives the same weights).

    **Arguments**

    - `in_features`, `out_features`, `hidden_features`: the sizes.
    - `depth`: the number of hidden layers (`0`: one `Linear`); `layers` holds the
      `depth + 1` `Linear`s.
    - `activation`: after every hidden layer (default `jax.nn.relu`).
    - `final_activation`: after the last layer (default: none).
    - `use_bias`, `use_final_bias`: biases of the hidden layers and of the last one.
    - `dtype`, `param_dtype`: as for `Linear`.
    - `key`: a PRNG key, split `depth + 1` ways.

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    mlp = tc.nn.MLP(2, 1, hidden_features=16, depth=2, key=jax.random.key(0))
    assert len(mlp.layers) == 3 and mlp(jnp.ones((5, 2))).shape == (5, 1)
    ```
    """

    layers: tuple[Linear, ...]
    activation: Callable[[Any], Any] = field(default=jax.nn.relu, static=True)
    final_activation: Callable[[Any], Any] = field(default=_identity, static=True)

    def __init__(
        self,
        in_features: int,
        out_features: int,
        hidden_features: int,
        depth: int,
        *,
        activation: Callable[[Any], Any] = jax.nn.relu,
        final_activation: Callable[[Any], Any] | None = None,
        use_bias: bool = True,
        use_final_bias: bool = True,
        dtype: DTypeLike | None = None,
        param_dtype: DTypeLike = jnp.float32,
        key: jax.Array,
    ) -> None:
        in_features = check_int("MLP", "in_features", in_features)
        out_features = check_int("MLP", "out_features", out_features)
        hidden_features = check_int("MLP", "hidden_features", hidden_features)
        depth = check_int("MLP", "depth", depth, minimum=0)
        keys = jax.random.split(check_key(key, "MLP"), depth + 1)
        sizes = [in_features, *([hidden_features] * depth), out_features]
        biases = [use_bias] * depth + [use_final_bias]
        assign(
            self,
            layers=tuple(
                Linear(n_in, n_out, use_bias=b, dtype=dtype, param_dtype=param_dtype, key=k)
                for n_in, n_out, b, k in zip(sizes, sizes[1:], biases, keys)
            ),
            activation=activation,
            final_activation=_identity if final_activation is None else final_activation,
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        """The layers in turn, the activation between them."""
        check_input("MLP", x, "in_features", getattr(self.layers[0], "in_features", None))
        *hidden, last = self.layers
        for layer in hidden:
            x = self.activation(layer(x))
        return self.final_activation(last(x))
