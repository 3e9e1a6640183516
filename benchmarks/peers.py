"""One adapter ("kit") per implementation, so every case builds the same model each way.

A kit knows how to build, with one library, the trees the cases need (a `Linear` layer,
an MLP holding a tuple of layers, an object with `n` fields, a layer with frozen parts)
and how that library does the edits (set one leaf deep, apply to every weight, set by
mask, leafwise arithmetic). An operation a library has no API for is `None`, and the
case leaves that library out of that comparison.

Peers are imported only when their kit is first built, so a missing peer costs nothing
but a skipped row: `get_kit` raises `PeerMissing` naming what to install.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["Kit", "PeerMissing", "KIT_NAMES", "get_kit", "import_peer", "mask_where"]

KIT_NAMES = ("treeclass", "dict", "dataclass", "flax", "equinox", "pytreeclass", "sepes")


class PeerMissing(ImportError):
    """A peer library is not installed; its rows are skipped."""


def import_peer(module: str, distribution: str | None = None) -> ModuleType:
    """Import a peer's `module`, or raise `PeerMissing` naming what to install.

    `distribution` is the name `pip` knows it by, when not the module's first part
    (`import_peer("orbax.checkpoint", "orbax-checkpoint")`).
    """
    try:
        return importlib.import_module(module)
    except ImportError as error:
        name = distribution or module.split(".")[0]
        raise PeerMissing(f"{name} is not installed (pip install {name})") from error


@dataclass
class Kit:
    """How one implementation builds and edits the benchmark trees.

    `style` is `"attr"` (layers read as `model.layers[i].weight`) or `"item"`
    (`params["layers"][i]["weight"]`). Optional operations are `None` when the library
    has no API for them.
    """

    name: str
    style: str
    linear: Callable[[Any, Any], Any]
    mlp: Callable[[Sequence[Any]], Any]
    wide: Callable[[Sequence[Any]], Any]
    named_linear: Callable[[Any, Any, str], Any]
    frozen_linear: Callable[[Any, Any, Any, str], Any] | None = None
    unfreeze: Callable[[Any], Any] | None = None
    set_deep: Callable[[Any, int, Any], Any] | None = None
    apply_weights: Callable[[Any, Callable[[Any], Any]], Any] | None = None
    mask_set: Callable[[Any, Any, Any], Any] | None = None
    leafwise_mlp: Callable[[Sequence[Any]], Any] | None = None
    # a layer with a distinct static int per layer (construction with static values)
    indexed_linear: Callable[[Any, Any, int], Any] | None = None
    # a layer whose activation name is a plain leaf, and the library's `tree_mask`
    tagged_linear: Callable[[Any, Any, str], Any] | None = None
    tree_mask: Callable[[Any], Any] | None = None
    summary: Callable[[Any], str] | None = None


def _wide_annotations(n: int) -> dict[str, Any]:
    return {f"f{i}": "Any" for i in range(n)}


def _weights_by_path_attr(model: Any, f: Callable[[Any], Any]) -> Any:
    return jax.tree_util.tree_map_with_path(
        lambda path, x: f(x) if path[-1].name == "weight" else x, model
    )


def _weights_by_path_item(params: Any, f: Callable[[Any], Any]) -> Any:
    return jax.tree_util.tree_map_with_path(
        lambda path, x: f(x) if path[-1].key == "weight" else x, params
    )


def mask_where(tree: Any, mask: Any, value: Any) -> Any:
    """The hand-written `.at[mask].set(value)`: `tree_map` with `jnp.where`."""
    return jax.tree_util.tree_map(lambda x, m: jnp.where(m, value, x), tree, mask)


# -- the floor: plain dicts and lists ---------------------------------------------------


def _dict_kit() -> Kit:
    def set_deep(params: Any, k: int, w: Any) -> Any:
        layers = params["layers"]
        return {**params, "layers": [*layers[:k], {**layers[k], "weight": w}, *layers[k + 1 :]]}

    return Kit(
        name="dict",
        style="item",
        linear=lambda w, b: {"weight": w, "bias": b},
        mlp=lambda layers: {"layers": list(layers)},
        wide=lambda values: {f"f{i}": v for i, v in enumerate(values)},
        named_linear=lambda w, b, name: {"weight": w, "bias": b},
        set_deep=set_deep,
        apply_weights=_weights_by_path_item,
        mask_set=mask_where,
    )


# -- jax.tree_util.register_dataclass ----------------------------------------------------


def _dataclass_kit() -> Kit:
    register = jax.tree_util.register_dataclass
    static = {"static": True}

    @register
    @dataclasses.dataclass
    class Linear:
        weight: Any
        bias: Any

    @register
    @dataclasses.dataclass
    class MLP:
        layers: tuple

    @register
    @dataclasses.dataclass
    class FrozenLinear:
        weight: Any
        bias: Any
        scale: Any
        act: str = dataclasses.field(metadata=static)

    @register
    @dataclasses.dataclass
    class NamedLinear:
        weight: Any
        bias: Any
        name: str = dataclasses.field(metadata=static)

    @register
    @dataclasses.dataclass
    class IndexedLinear:
        weight: Any
        bias: Any
        index: int = dataclasses.field(metadata=static)

    @functools.cache
    def wide_class(n: int) -> type:
        cls = dataclasses.make_dataclass(f"Wide{n}", [(f"f{i}", Any) for i in range(n)])
        return register(cls)

    def set_deep(model: Any, k: int, w: Any) -> Any:
        layers = model.layers
        layer = dataclasses.replace(layers[k], weight=w)
        return dataclasses.replace(model, layers=(*layers[:k], layer, *layers[k + 1 :]))

    return Kit(
        name="dataclass",
        style="attr",
        linear=Linear,
        mlp=lambda layers: MLP(tuple(layers)),
        wide=lambda values: wide_class(len(values))(*values),
        named_linear=NamedLinear,
        frozen_linear=FrozenLinear,
        unfreeze=lambda model: model,
        set_deep=set_deep,
        apply_weights=_weights_by_path_attr,
        indexed_linear=IndexedLinear,
    )


# -- flax.struct.PyTreeNode --------------------------------------------------------------


def _flax_kit() -> Kit:
    struct = import_peer("flax.struct")

    class Linear(struct.PyTreeNode):
        weight: Any
        bias: Any

    class MLP(struct.PyTreeNode):
        layers: tuple

    class FrozenLinear(struct.PyTreeNode):
        weight: Any
        bias: Any
        scale: Any
        act: str = struct.field(pytree_node=False)

    class NamedLinear(struct.PyTreeNode):
        weight: Any
        bias: Any
        name: str = struct.field(pytree_node=False)

    class IndexedLinear(struct.PyTreeNode):
        weight: Any
        bias: Any
        index: int = struct.field(pytree_node=False)

    @functools.cache
    def wide_class(n: int) -> type:
        return type(
            f"Wide{n}",
            (struct.PyTreeNode,),
            {"__annotations__": _wide_annotations(n), "__module__": __name__},
        )

    def set_deep(model: Any, k: int, w: Any) -> Any:
        layers = model.layers
        layer = layers[k].replace(weight=w)
        return model.replace(layers=(*layers[:k], layer, *layers[k + 1 :]))

    return Kit(
        name="flax",
        style="attr",
        linear=Linear,
        mlp=lambda layers: MLP(tuple(layers)),
        wide=lambda values: wide_class(len(values))(*values),
        named_linear=NamedLinear,
        frozen_linear=FrozenLinear,
        unfreeze=lambda model: model,
        set_deep=set_deep,
        apply_weights=_weights_by_path_attr,
        indexed_linear=IndexedLinear,
    )


# -- equinox.Module ----------------------------------------------------------------------


def _equinox_kit() -> Kit:
    eqx = import_peer("equinox")

    class Linear(eqx.Module):
        weight: Any
        bias: Any

    class MLP(eqx.Module):
        layers: tuple

    class FrozenLinear(eqx.Module):
        weight: Any
        bias: Any
        scale: Any
        act: str = eqx.field(static=True)

    class NamedLinear(eqx.Module):
        weight: Any
        bias: Any
        name: str

    class IndexedLinear(eqx.Module):
        weight: Any
        bias: Any
        index: int = eqx.field(static=True)

    @functools.cache
    def wide_class(n: int) -> type:
        return type(
            f"Wide{n}",
            (eqx.Module,),
            {"__annotations__": _wide_annotations(n), "__module__": __name__},
        )

    def set_deep(model: Any, k: int, w: Any) -> Any:
        return eqx.tree_at(lambda m: m.layers[k].weight, model, w)

    def apply_weights(model: Any, f: Callable[[Any], Any]) -> Any:
        return eqx.tree_at(lambda m: [layer.weight for layer in m.layers], model, replace_fn=f)

    return Kit(
        name="equinox",
        style="attr",
        linear=Linear,
        mlp=lambda layers: MLP(tuple(layers)),
        wide=lambda values: wide_class(len(values))(*values),
        named_linear=NamedLinear,
        frozen_linear=FrozenLinear,
        unfreeze=lambda model: model,
        set_deep=set_deep,
        apply_weights=apply_weights,
        indexed_linear=IndexedLinear,
    )


# -- pytreeclass and sepes (same family of API) ----------------------------------------


def _pytreeclass_kit() -> Kit:
    pytc = import_peer("pytreeclass")

    @pytc.autoinit
    class Linear(pytc.TreeClass):
        weight: Any
        bias: Any

    @pytc.autoinit
    class MLP(pytc.TreeClass):
        layers: tuple

    @pytc.leafwise
    @pytc.autoinit
    class LeafwiseMLP(pytc.TreeClass):
        layers: tuple

    @pytc.autoinit
    class FrozenLinear(pytc.TreeClass):
        weight: Any
        bias: Any
        scale: Any
        act: Any

    @pytc.autoinit
    class NamedLinear(pytc.TreeClass):
        weight: Any
        bias: Any
        name: Any

    @pytc.autoinit
    class TaggedLinear(pytc.TreeClass):
        weight: Any
        bias: Any
        act: Any

    @functools.cache
    def wide_class(n: int) -> type:
        cls = type(
            f"Wide{n}",
            (pytc.TreeClass,),
            {"__annotations__": _wide_annotations(n), "__module__": __name__},
        )
        return pytc.autoinit(cls)

    def unfreeze(model: Any) -> Any:
        return jax.tree_util.tree_map(pytc.unfreeze, model, is_leaf=pytc.is_frozen)

    return Kit(
        name="pytreeclass",
        style="attr",
        linear=Linear,
        mlp=lambda layers: MLP(tuple(layers)),
        wide=lambda values: wide_class(len(values))(*values),
        # the published comparison freezes the name, as its notebooks do
        named_linear=lambda w, b, name: NamedLinear(w, b, pytc.freeze(name)),
        frozen_linear=lambda w, b, s, a: FrozenLinear(w, b, pytc.freeze(s), pytc.freeze(a)),
        unfreeze=unfreeze,
        set_deep=lambda model, k, w: model.at["layers"][k]["weight"].set(w),
        apply_weights=lambda model, f: model.at["layers"][...]["weight"].apply(f),
        mask_set=lambda model, mask, v: model.at[mask].set(v),
        leafwise_mlp=lambda layers: LeafwiseMLP(tuple(layers)),
        # pytreeclass has no static fields: the index is frozen, as its docs do
        indexed_linear=lambda w, b, i: NamedLinear(w, b, pytc.freeze(i)),
        tagged_linear=TaggedLinear,
        tree_mask=pytc.tree_mask,
        summary=pytc.tree_summary,
    )


def _sepes_kit() -> Kit:
    sp = import_peer("sepes")

    @sp.autoinit
    class Linear(sp.TreeClass):
        weight: Any
        bias: Any

    @sp.autoinit
    class MLP(sp.TreeClass):
        layers: tuple

    @sp.leafwise
    @sp.autoinit
    class LeafwiseMLP(sp.TreeClass):
        layers: tuple

    @sp.autoinit
    class FrozenLinear(sp.TreeClass):
        weight: Any
        bias: Any
        scale: Any
        act: Any

    @sp.autoinit
    class NamedLinear(sp.TreeClass):
        weight: Any
        bias: Any
        name: Any

    @sp.autoinit
    class TaggedLinear(sp.TreeClass):
        weight: Any
        bias: Any
        act: Any

    @functools.cache
    def wide_class(n: int) -> type:
        cls = type(
            f"Wide{n}",
            (sp.TreeClass,),
            {"__annotations__": _wide_annotations(n), "__module__": __name__},
        )
        return sp.autoinit(cls)

    def frozen_linear(w: Any, b: Any, scale: Any, act: str) -> Any:
        # sepes has no per-value freeze: mask the tree, picking the two values by identity
        layer = FrozenLinear(w, b, scale, act)
        return sp.tree_mask(layer, cond=lambda x: x is scale or isinstance(x, str))

    return Kit(
        name="sepes",
        style="attr",
        linear=Linear,
        mlp=lambda layers: MLP(tuple(layers)),
        wide=lambda values: wide_class(len(values))(*values),
        named_linear=lambda w, b, name: sp.tree_mask(NamedLinear(w, b, name)),
        frozen_linear=frozen_linear,
        unfreeze=sp.tree_unmask,
        set_deep=lambda model, k, w: model.at["layers"][k]["weight"].set(w),
        apply_weights=lambda model, f: model.at["layers"][...]["weight"].apply(f),
        mask_set=lambda model, mask, v: model.at[mask].set(v),
        leafwise_mlp=lambda layers: LeafwiseMLP(tuple(layers)),
        # sepes has no static fields: mask the layer, which freezes the int index
        indexed_linear=lambda w, b, i: sp.tree_mask(NamedLinear(w, b, i)),
        tagged_linear=TaggedLinear,
        tree_mask=sp.tree_mask,
        summary=sp.tree_summary,
    )


# -- treeclass ---------------------------------------------------------------------------


def _treeclass_kit() -> Kit:
    try:
        import treeclass as tc
    except ImportError as error:
        raise PeerMissing("treeclass is not importable (pip install -e .)") from error

    class Linear(tc.TreeClass):
        weight: Any
        bias: Any

    class MLP(tc.TreeClass):
        layers: tuple

    class FrozenLinear(tc.TreeClass):
        weight: Any
        bias: Any
        scale: Any
        act: Any

    class NamedLinear(tc.TreeClass):
        weight: Any
        bias: Any
        name: str = tc.field(static=True)

    class IndexedLinear(tc.TreeClass):
        weight: Any
        bias: Any
        index: int = tc.field(static=True)

    class TaggedLinear(tc.TreeClass):
        weight: Any
        bias: Any
        act: Any

    @functools.cache
    def wide_class(n: int) -> type:
        return type(
            f"Wide{n}",
            (tc.TreeClass,),
            {"__annotations__": _wide_annotations(n), "__module__": __name__},
        )

    @functools.cache
    def leafwise_class() -> type:
        # defined on first use: `leafwise=True` raises until the leafwise module lands
        class LeafwiseMLP(tc.TreeClass, leafwise=True):
            layers: tuple

        return LeafwiseMLP

    def unfreeze(model: Any) -> Any:
        return jax.tree_util.tree_map(tc.unfreeze, model, is_leaf=tc.is_frozen)

    return Kit(
        name="treeclass",
        style="attr",
        linear=Linear,
        mlp=lambda layers: MLP(tuple(layers)),
        wide=lambda values: wide_class(len(values))(*values),
        named_linear=NamedLinear,
        frozen_linear=lambda w, b, s, a: FrozenLinear(w, b, tc.freeze(s), tc.freeze(a)),
        unfreeze=unfreeze,
        set_deep=lambda model, k, w: model.at["layers"][k]["weight"].set(w),
        apply_weights=lambda model, f: model.at[Linear]["weight"].apply(f),
        mask_set=lambda model, mask, v: model.at[mask].set(v),
        leafwise_mlp=lambda layers: leafwise_class()(tuple(layers)),
        indexed_linear=IndexedLinear,
        tagged_linear=TaggedLinear,
        tree_mask=tc.tree_mask,
        summary=tc.tree_summary,
    )


_BUILDERS: dict[str, Callable[[], Kit]] = {
    "treeclass": _treeclass_kit,
    "dict": _dict_kit,
    "dataclass": _dataclass_kit,
    "flax": _flax_kit,
    "equinox": _equinox_kit,
    "pytreeclass": _pytreeclass_kit,
    "sepes": _sepes_kit,
}


@functools.cache
def get_kit(name: str) -> Kit:
    """The kit of implementation `name` (one of `KIT_NAMES`), built and cached on first use.

    **Arguments**

    - `name`: `"treeclass"`, `"dict"`, `"dataclass"`, `"flax"`, `"equinox"`,
      `"pytreeclass"` or `"sepes"`.

    **Returns**

    The `Kit`; raises `PeerMissing` when the library is not installed.

    ```python
    from benchmarks.peers import get_kit

    kit = get_kit("dict")
    assert kit.linear(1.0, 2.0) == {"weight": 1.0, "bias": 2.0}
    ```
    """
    return _BUILDERS[name]()
