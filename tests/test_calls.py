"""Mutating code run on copies (`_calls`): `tree.at["method"](...)` and `value_and_tree`.

The rules: the input is never changed, whether the function returns or raises; only the
node whose method runs is copied (siblings are shared, never visited); the copy's
TreeClass nodes are immutable again afterwards.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treeclass as tc


class Linear(tc.TreeClass):
    def __init__(self, n):
        self.weight = jnp.ones(n)
        self.buffer = np.zeros(n)

    def scale(self, by):
        self.weight = self.weight * by
        return by

    def poke(self):
        self.buffer[0] = -1.0


class Stack(tc.TreeClass):
    def __init__(self, n):
        self.layers = [Linear(2) for _ in range(n)]


def test_method_of_a_plain_container_runs_on_a_copy():
    tree = {"items": [1, 2], "other": [3]}
    value, new = tc.at(tree)["items"]["append"](9)
    assert value is None and new == {"items": [1, 2, 9], "other": [3]}
    assert tree == {"items": [1, 2], "other": [3]}


def test_nested_method_call_shares_the_siblings():
    model = Stack(3)
    _, new = model.at["layers"][1]["scale"](2.0)
    assert new.layers[0] is model.layers[0] and new.layers[2] is model.layers[2]
    assert new.layers[1].weight.tolist() == [2.0, 2.0]
    assert model.layers[1].weight.tolist() == [1.0, 1.0]


def test_method_call_does_not_visit_other_branches():
    class Exploding:
        """A registered node whose flatten fails: touching it would raise."""

    jax.tree_util.register_pytree_node(
        Exploding, lambda x: (_ for _ in ()).throw(AssertionError("visited")), lambda *_: None
    )
    tree = {"hot": Linear(1), "cold": Exploding()}
    factor, new = tc.at(tree)["hot"]["scale"](3.0)
    assert factor == 3.0 and new["cold"] is tree["cold"]


def test_nested_method_writing_a_numpy_buffer_leaves_the_input_intact():
    model = Stack(2)
    _, new = model.at["layers"][0]["poke"]()
    assert new.layers[0].buffer.tolist() == [-1.0, 0.0]
    assert model.layers[0].buffer.tolist() == [0.0, 0.0]


def test_method_call_on_a_missing_path_names_it():
    with pytest.raises(IndexError, match=r"index 5 out of range at Stack\.layers"):
        Stack(2).at["layers"][5]["scale"](1.0)


def test_method_call_errors_are_the_selection_errors():
    model = Stack(2)
    with pytest.raises(AttributeError, match="did you mean 'scale'"):
        model.at["layers"][0]["scal"](1.0)
    for chain in (["layers", "x"], ["layerz"], ["layers", -3]):
        with pytest.raises(LookupError) as by_get:
            tc.at(model, where=chain).get()
        with pytest.raises(LookupError) as by_call:
            tc.at(model, where=[*chain, "scale"])(1.0)
        assert str(by_call.value) == str(by_get.value)


def test_value_and_tree_results_are_sealed():
    _, new = tc.value_and_tree(lambda m: m.layers[0].scale(2.0))(Stack(1))
    with pytest.raises(AttributeError):
        new.layers[0].weight = 0.0


def test_value_and_tree_keeps_the_keyword_order_of_the_call():
    def order(**kwargs):
        return list(kwargs)

    assert tc.value_and_tree(order, argnums=())(b=1, a=2) == (["b", "a"], ())
