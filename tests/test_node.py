"""Tests for the TreeClass node contract (treeclass/_node.py): the names in `_node.__all__`
behave as their docstrings say, seen from the modules that use them."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import pytest
from conftest import MLP, Linear

import treeclass as tc
from treeclass import _node


def _layer(bias: float = 0.0, name: str = "linear") -> Linear:
    return Linear(jnp.ones((2, 2)), jnp.full(2, bias), name=name)


class Plain:
    pass


# -- what a node is --------------------------------------------------------------------------


def test_is_treeclass_is_true_for_instances_only():
    assert _node.is_treeclass(_layer())
    assert isinstance(_layer(), _node.TreeNode)
    assert not _node.is_treeclass(Linear)
    assert not _node.is_treeclass({"weight": 1.0})
    assert not _node.is_treeclass(Plain())


def test_own_info_is_the_class_record_not_an_inherited_one():
    class Scaled(Linear):
        scale: float = 1.0

    assert _node.own_info(Plain) is None
    assert _node.own_info(Linear) is _node.info(_layer())
    assert _node.own_info(Scaled) is not None and _node.own_info(Scaled) is not _node.own_info(
        Linear
    )


def test_fields_of_and_static_names_read_the_declared_fields():
    assert list(_node.fields_of(Linear)) == ["weight", "bias", "name"]
    assert _node.static_names(Linear) == ("name",)


# -- children and static values ---------------------------------------------------------------


def test_children_are_the_leaves_jax_flattens_in_the_same_order():
    layer = _layer(bias=3.0)
    assert _node.child_names(layer) == ("weight", "bias")
    flat, _ = jax.tree_util.tree_flatten(layer)
    assert all(a is b for a, b in zip(_node.children(layer), flat, strict=True))


def test_opened_gives_key_entries_a_fresh_list_and_names_in_one_look():
    layer = _layer()
    entries, kids, names = _node.opened(layer)
    assert entries == (jax.tree_util.GetAttrKey("weight"), jax.tree_util.GetAttrKey("bias"))
    assert names == ("weight", "bias") and kids == list(_node.children(layer))
    kids.append("x")  # a fresh list: the node is untouched
    assert len(_node.children(layer)) == 2


def test_static_values_and_child_keep_statics_apart_from_children():
    layer = _layer(name="first")
    assert _node.static_values(layer) == {"name": "first"}
    assert _node.child(layer, "bias") is layer.bias
    assert _node.child(layer, "name") is _node.NOTHING
    assert _node.child(layer, "missing") is _node.NOTHING


def test_attributes_is_the_instance_dict_in_assignment_order():
    layer = _layer()
    assert list(_node.attributes(layer)) == ["weight", "bias", "name"]
    assert _node.attributes(layer)["bias"] is layer.bias


# -- copies with other children ----------------------------------------------------------------


def test_replace_children_makes_a_sealed_copy_and_leaves_the_node_as_it_was():
    layer = _layer()
    new = _node.replace_children(layer, {"bias": jnp.ones(2)})
    assert new.bias.tolist() == [1.0, 1.0] and layer.bias.tolist() == [0.0, 0.0]
    assert new.weight is layer.weight and new.name == layer.name
    assert _node.is_sealed(new)
    with pytest.raises(AttributeError, match="immutable"):
        new.bias = 0


def test_rebuild_replaces_every_child_in_child_names_order():
    layer = _layer()
    new = _node.rebuild(layer, [jnp.zeros((2, 2)), jnp.ones(2)])
    assert type(new) is Linear and new.name == "linear"
    assert new.weight.tolist() == [[0.0, 0.0], [0.0, 0.0]] and new.bias.tolist() == [1.0, 1.0]
    assert jax.tree_util.tree_structure(new) == jax.tree_util.tree_structure(layer)


def test_rebuild_with_the_wrong_number_of_children_names_the_class_and_its_children():
    with pytest.raises(ValueError, match=r"`Linear` from 1 children: its layout has 2 \(weight"):
        _node.rebuild(_layer(), [jnp.zeros(2)])


# -- sealing ---------------------------------------------------------------------------------


def test_instances_are_sealed_once_init_returns():
    layer = _layer()
    assert _node.is_sealed(layer)
    with pytest.raises(AttributeError, match=r"Cannot set attribute 'bias' of an immutable"):
        _node.refuse_write(layer, "bias", "set")
    with pytest.raises(AttributeError, match=r"del tree.bias"):
        _node.refuse_write(layer, "bias", "delete")


def test_unsealed_copy_may_change_and_reseal_freezes_it_again():
    model = MLP((2, 3, 1))
    work = _node.unsealed_copy(model)
    assert not any(_node.is_sealed(n) for n in _node.treeclass_nodes(work))
    work.layers[0].bias = jnp.ones(3)  # allowed on the copy
    _node.reseal(work)
    assert all(_node.is_sealed(n) for n in _node.treeclass_nodes(work))
    assert work.layers[0].bias.tolist() == [1.0, 1.0, 1.0]
    assert model.layers[0].bias.tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(AttributeError, match="immutable"):
        work.layers[0].bias = 0


def test_unsealed_copy_copies_numpy_buffers():
    import numpy as np

    class Buffer(tc.TreeClass):
        data: np.ndarray

    tree = Buffer(np.zeros(2))
    work = _node.unsealed_copy(tree)
    work.data[0] = 5.0
    assert tree.data.tolist() == [0.0, 0.0]


def test_unseal_then_seal_takes_in_a_changed_attribute():
    layer = _layer()
    work = _node.replace_children(layer, {})
    _node.unseal(work)
    assert not _node.is_sealed(work)
    _node.attributes(work)["bias"] = jnp.ones(2)
    _node.seal(work)
    assert _node.is_sealed(work) and jax.tree_util.tree_leaves(work)[1].tolist() == [1.0, 1.0]


def test_seal_like_reuses_the_attribute_order_of_a_sealed_node():
    layer = _layer(name="a")
    work = _node.replace_children(layer, {})
    _node.unseal(work)
    _node.attributes(work)["name"] = "b"
    _node.seal_like(work, layer)
    assert _node.is_sealed(work) and work.name == "b"
    assert jax.tree_util.tree_structure(work) != jax.tree_util.tree_structure(layer)
    assert jax.tree_util.tree_leaves(work)[0] is layer.weight


def test_seal_after_error_leaves_a_failed_instance_immutable():
    class Checked(tc.TreeClass):
        def __init__(self, x):
            self.x = x
            raise ValueError("bad x")

    seen = []

    class Keeper(Checked):
        def __init__(self, x):
            seen.append(self)
            super().__init__(x)

    with pytest.raises(ValueError, match="bad x"):
        Keeper(1)
    assert _node.is_sealed(seen[0])
    with pytest.raises(AttributeError, match="immutable"):
        seen[0].x = 2


def test_treeclass_nodes_lists_parents_before_children():
    model = MLP((2, 3, 1))
    nodes = list(_node.treeclass_nodes({"model": model}))
    assert nodes == [model, *model.layers]


# -- the class machinery ---------------------------------------------------------------------


def test_every_field_name_has_a_guard_on_the_class():
    for name in ("weight", "bias", "name"):
        assert isinstance(inspect.getattr_static(Linear, name), _node.GUARDS)
    assert Linear.name == "linear"  # the guard's class value is the default


def test_live_layouts_holds_one_layout_per_distinct_non_plain_static_value_in_use():
    class Tagged(tc.TreeClass):
        x: float
        tag: tuple = tc.field(static=True)

    first, second = Tagged(1.0, (1, 2)), Tagged(2.0, (3,))
    jax.tree_util.tree_flatten(first), jax.tree_util.tree_flatten(second)
    assert len(_node.live_layouts(Tagged)) == 2
    again = Tagged(3.0, (1, 2))
    assert jax.tree_util.tree_structure(again) == jax.tree_util.tree_structure(first)
    assert len(_node.live_layouts(Tagged)) == 2  # equal static values share one layout


def test_registered_class_round_trips_through_jax():
    layer = _layer(name="kept")
    leaves, treedef = jax.tree_util.tree_flatten(layer)
    back = jax.tree_util.tree_unflatten(treedef, leaves)
    assert type(back) is Linear and back.name == "kept" and _node.is_sealed(back)
    assert tc.is_tree_equal(back, layer)
