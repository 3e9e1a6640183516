"""Typed user code, written the way the docs write it, checked by pyright and mypy.

`tests/test_typing.py` runs both checkers on this file and compares what they report with
the markers: a line ending in `# E: both` (or `# E: pyright`, `# E: mypy`) must be
reported as an error by that checker, and no other line may be. `assert_type` lines are
errors when a type is not the one written. The test also runs the file, so everything
outside `_errors` works at run time too.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from typing_extensions import assert_type

import treeclass as tc
import treeclass.optim
from treeclass import nn

# -- classes: the generated __init__ ----------------------------------------------------


class Linear(tc.TreeClass):
    weight: jax.Array
    bias: jax.Array
    name: str = tc.field(default="linear", static=True)

    def __call__(self, x: jax.Array) -> jax.Array:
        return x @ self.weight + self.bias


class Block(tc.TreeClass):
    linear: Linear
    activation: Callable[[jax.Array], jax.Array] = tc.freeze(jax.nn.relu)  # annotated as held
    scale: float = tc.field(default=1.0, on_setattr=[float])
    tags: tuple[str, ...] = tc.field(factory=tuple)
    count: int = tc.field(default=0, init=False)
    rate: float = tc.field(default=0.1, alias="learning_rate")

    def __call__(self, x: jax.Array) -> jax.Array:
        return tc.unfreeze(self.activation)(self.linear(x)) * self.scale


class MLP(tc.TreeClass):
    """Fields and a classmethod: the typed way to build from arguments (see the docs)."""

    layers: tuple[Linear, ...]

    @classmethod
    def create(cls, sizes: list[int], key: jax.Array) -> MLP:
        keys = jax.random.split(key, len(sizes) - 1)
        return cls(
            tuple(
                Linear(jax.random.normal(k, (i, o)), jnp.zeros(o))
                for k, i, o in zip(keys, sizes[:-1], sizes[1:])
            )
        )


class Counter(tc.TreeClass):
    count: int = 0

    def increment(self, by: int) -> int:
        self.count += by  # E: both
        return self.count


@tc.autoinit
class Point:  # a plain class: an __init__ from its fields, not frozen
    x: float
    y: float = 0.0


class Scaled(tc.TreeClass, leafwise=True):
    value: jax.Array


class Handwritten(tc.TreeClass):
    """A hand-written `__init__`: checkers take instances to be frozen all along."""

    def __init__(self, width: int) -> None:
        self.width = width  # E: pyright


layer = Linear(jnp.ones((3, 2)), jnp.zeros(2))
assert_type(layer, Linear)
block = Block(layer, learning_rate=0.2)
assert_type(block.scale, float)
assert_type(block.rate, float)
model = MLP.create([3, 4, 1], jax.random.key(0))
assert_type(model.layers[0].weight, jax.Array)
assert_type(Handwritten(2).width, int)
point = Point(1.0)
point.x = 2.0
assert_type(point.y, float)

# -- fields -----------------------------------------------------------------------------

field_a = tc.fields(Linear)[0]
assert_type(field_a, tc.Field)
assert_type(field_a.name, str)
assert_type(field_a.static, bool)
assert_type(field_a.default, Any)

# -- editing: the model's own type comes back --------------------------------------------

assert_type(layer.at, tc.AtIndexer[Linear])
assert_type(layer.at["bias"].set(1.0), Linear)
assert_type(layer.at["weight"].apply(lambda w: w * 2), Linear)
assert_type(model.at[Linear]["weight"].apply(jnp.zeros_like), MLP)
assert_type(model.at[tc.glob("layers.*.bias")].set(0.0), MLP)
assert_type(model.at[...].get(), MLP)


def add_sizes(total: int, leaf: jax.Array) -> int:
    return total + leaf.size


assert_type(model.at[...].reduce(add_sizes, initializer=0), int)


def count_leaves(leaf: Any, seen: int) -> tuple[Any, int]:
    return leaf, seen + 1


assert_type(model.at[...].scan(count_leaves, 0), tuple[MLP, int])
value, counter = Counter().at["increment"](2)
assert_type(counter, Counter)
params = {"w": jnp.ones(2), "b": jnp.zeros(2)}
assert_type(tc.at(params)["w"].set(jnp.zeros(2)), dict[str, jax.Array])

# replace: a validated copy of the same class
assert_type(block.replace(scale=2), Block)
assert_type(layer.replace(name="head"), Linear)

# -- masking and tree maps keep the tree's type --------------------------------------------

assert_type(tc.freeze(layer), Linear)
assert_type(tc.unfreeze(tc.freeze(layer)), Linear)
assert_type(tc.tree_mask(block), Block)
assert_type(tc.tree_unmask(tc.tree_mask(block)), Block)
assert_type(tc.roles(block), Block)  # the same nodes, role names as leaves (as optim.mask)
assert_type(tc.is_frozen(block.activation), bool)
assert_type(tc.bcmap(jnp.add)(params, 1.0), dict[str, jax.Array])
assert_type(tc.is_tree_equal(layer, layer), Any)
add_one = tc.Partial(jnp.add, 1.0)
assert_type(add_one, tc.Partial[jax.Array])
assert_type(add_one.args, tuple[Any, ...])
assert_type(add_one(2.0), jax.Array)

# -- optax ----------------------------------------------------------------------------------

weight_mask = tc.optim.mask(model.at[Linear]["weight"])
assert_type(weight_mask, MLP)
labels = tc.optim.labels(model, {"decay": model.at[Linear]["weight"]})
assert_type(labels, tc.optim.Labels[MLP])
assert_type(labels.tree, MLP)
assert_type(tc.optim.check_mask(weight_mask, model), MLP)  # checked and handed back as given
assert_type(tc.optim.check_labels(labels, model), tc.optim.Labels[MLP])
opt = optax.adamw(1e-3, mask=weight_mask)  # (optax types `init`'s params as arrays and
# containers, so pyright refuses a model there: the docs' "Types and editors" says more)

# -- layers: a key is a PRNG key array, a dtype what `jnp.dtype` takes ---------------------

dense = nn.Linear(3, 4, key=jax.random.key(0), param_dtype="float32")
assert_type(dense, nn.Linear)
assert_type(nn.Dropout(0.1)(jnp.ones(4), key=jax.random.key(1)), jax.Array)

# -- printing and checkpoints ----------------------------------------------------------------

assert_type(tc.tree_repr(layer), str)
assert_type(tc.tree_summary(model), str)
assert_type(tc.tree_diagram(model, depth=1), str)
with tempfile.TemporaryDirectory() as folder:
    tc.save(f"{folder}/model.safetensors", model)
    assert_type(tc.load(f"{folder}/model.safetensors", model), MLP)
assert_type(tc.from_state_dict(layer, tc.state_dict(layer)), Linear)
restored, report = tc.from_state_dict(layer, tc.state_dict(layer), strict=False)
assert_type(restored, Linear)


# -- what checkers must refuse ---------------------------------------------------------------


def _errors() -> None:  # never called: each line is a mistake a checker catches
    layer.weight = jnp.ones(2)  # E: both
    Linear(jnp.ones(2))  # E: both
    Linear(jnp.ones(2), jnp.ones(2), nmae="x")  # E: both
    Linear(1, jnp.ones(2))  # E: both
    Block(layer, rate=0.2)  # E: both
    Block(layer, count=1)  # E: both
    tags: tuple[str, ...] = tc.field(default="not a tuple")  # E: both
    print(tags)
    Point("a")  # E: both
    Scaled(jnp.ones(2)) * 2  # E: both
    nn.Linear(3, 4, key=0)  # E: both
