"""Tests of `TreeClass`: pytree registration, immutability, dunders and static fields."""

from __future__ import annotations

import abc
import copy
import importlib.resources
import keyword
import pathlib
import pickle
import threading
import types
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import Linear
from hypothesis import given, settings
from hypothesis import strategies as st

import treeclass as tc
from treeclass import _node
from treeclass._treeclass import TreeClass

GetAttrKey = jax.tree_util.GetAttrKey

# Module-level classes: pickle finds classes by their qualified name.


class MLP(tc.TreeClass):
    def __init__(self, sizes, key=0):
        self.layers = tuple(
            Linear(jnp.full((i, o), float(key + n)), jnp.zeros(o), name=f"layer{n}")
            for n, (i, o) in enumerate(zip(sizes[:-1], sizes[1:], strict=True))
        )
        self.scale = 1.0


class Point(tc.TreeClass):
    x: Any
    y: Any = 0.0


class WithStatic(tc.TreeClass):
    value: Any
    tag: Any = tc.field(default="a", static=True)


def _mlp():
    return MLP([3, 4, 2])


# -- registration ---------------------------------------------------------------------------


def test_subclass_is_registered_pytree_with_leaves_in_assignment_order():
    tree = Point(1.0, 2.0)
    assert jax.tree_util.tree_leaves(tree) == [1.0, 2.0]
    assert jax.tree_util.tree_leaves(WithStatic(3.0, tag="t")) == [3.0]


def test_hand_written_init_children_follow_assignment_order():
    class Tree(tc.TreeClass):
        def __init__(self):
            self.z = 1
            self.a = 2
            self.m = 3

    assert jax.tree_util.tree_leaves(Tree()) == [1, 2, 3]


def test_subclass_of_subclass_is_registered():
    class Child(Point):
        z: float = 3.0

    assert jax.tree_util.tree_leaves(Child(1.0)) == [1.0, 0.0, 3.0]
    assert type(jax.tree_util.tree_map(lambda v: v, Child(1.0))) is Child


def test_tree_map_returns_same_class_with_static_fields_kept():
    tree = WithStatic(jnp.ones(2), tag="kept")
    mapped = jax.tree_util.tree_map(lambda v: v * 3, tree)
    assert type(mapped) is WithStatic
    assert mapped.tag == "kept"
    np.testing.assert_array_equal(mapped.value, [3.0, 3.0])


def test_tree_map_result_is_immutable():
    mapped = jax.tree_util.tree_map(lambda v: v, Point(1.0))
    with pytest.raises(AttributeError, match="immutable `Point` instance"):
        mapped.x = 2.0


def test_flatten_with_path_uses_getattr_keys():
    paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(_mlp())[0]]
    assert paths[0] == (GetAttrKey("layers"), jax.tree_util.SequenceKey(0), GetAttrKey("weight"))
    assert paths[-1] == (GetAttrKey("scale"),)
    assert jax.tree_util.keystr(paths[1]) == ".layers[0].bias"


def test_getattr_keys_are_built_once_per_class_and_name():
    first = jax.tree_util.tree_flatten_with_path(Point(1.0, 2.0))[0]
    second = jax.tree_util.tree_flatten_with_path(Point(3.0, 4.0))[0]
    assert all(a[0][0] is b[0][0] for a, b in zip(first, second, strict=True))


def test_unflatten_calls_neither_init_nor_field_callbacks():
    calls = []

    class Tree(tc.TreeClass):
        a: float = tc.field(on_setattr=lambda v: calls.append("set") or v)

        def __post_init__(self):
            calls.append("post_init")

    tree = Tree(1.0)
    assert calls == ["set", "post_init"]
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    rebuilt = jax.tree_util.tree_unflatten(treedef, [v * 2 for v in leaves])
    assert rebuilt.a == 2.0
    assert calls == ["set", "post_init"]


def test_jit_takes_and_returns_instances():
    @jax.jit
    def double(tree):
        return jax.tree_util.tree_map(lambda v: v * 2, tree)

    out = double(_mlp())
    assert type(out) is MLP and type(out.layers[1]) is Linear
    assert out.layers[1].name == "layer1"
    np.testing.assert_array_equal(out.layers[1].weight, np.full((4, 2), 2.0))


def test_grad_returns_same_class():
    def loss(layer):
        return jnp.sum(layer.weight**2) + jnp.sum(layer.bias)

    grads = jax.grad(loss)(Linear(jnp.ones((2, 2)), jnp.zeros(2), name="g"))
    assert type(grads) is Linear and grads.name == "g"
    np.testing.assert_array_equal(grads.weight, np.full((2, 2), 2.0))
    np.testing.assert_array_equal(grads.bias, np.ones(2))


def test_vmap_over_instances_in_and_out():
    batch = Point(jnp.arange(3.0), jnp.ones(3))
    out = jax.vmap(lambda p: Point(p.x + p.y, p.x * 2))(batch)
    assert type(out) is Point
    np.testing.assert_array_equal(out.x, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(out.y, [0.0, 2.0, 4.0])


def test_scan_over_instances_as_carry_and_xs():
    def step(carry, xs):
        new = Point(carry.x + xs.x, carry.y * xs.y)
        return new, xs.x

    xs = Point(jnp.arange(4.0), jnp.full(4, 2.0))
    final, ys = jax.lax.scan(step, Point(jnp.float32(0), jnp.float32(1)), xs)
    assert type(final) is Point
    assert (float(final.x), float(final.y)) == (6.0, 16.0)
    np.testing.assert_array_equal(ys, [0.0, 1.0, 2.0, 3.0])


# -- static fields: flatten, jit, ==, hash -----------------------------------------------------


def test_static_field_lives_in_treedef_and_survives_round_trip():
    leaves, treedef = jax.tree_util.tree_flatten(WithStatic(1.0, tag=("x", 2)))
    assert leaves == [1.0]
    rebuilt = jax.tree_util.tree_unflatten(treedef, [5.0])
    assert vars(rebuilt) == {"value": 5.0, "tag": ("x", 2)}


def test_static_field_takes_part_in_eq_and_hash():
    assert WithStatic(1.0, tag="a") == WithStatic(1.0, tag="a")
    assert WithStatic(1.0, tag="a") != WithStatic(1.0, tag="b")
    assert hash(WithStatic(1.0, tag="a")) == hash(WithStatic(1.0, tag="a"))
    assert len({WithStatic(1.0, tag="a"), WithStatic(1.0, tag="b")}) == 2


@pytest.mark.parametrize("values", [(1, 1.0), (1, True), (0.0, False)])
def test_equal_static_values_of_different_types_keep_their_type(values):
    trees = [WithStatic(0.0, tag=v) for v in values]
    treedefs = [jax.tree_util.tree_structure(t) for t in trees]
    assert treedefs[0] != treedefs[1]
    for value, treedef in zip(values, treedefs, strict=True):
        rebuilt = jax.tree_util.tree_unflatten(treedef, [0.0])
        assert type(rebuilt.tag) is type(value)


def test_signed_zero_static_values_keep_their_sign_under_jit():
    divide = jax.jit(lambda tree: tree.value / tree.tag)
    assert float(divide(WithStatic(jnp.float32(1), tag=0.0))) == float("inf")
    negative = WithStatic(jnp.float32(1), tag=-0.0)
    assert float(divide(negative)) == float("-inf")
    assert str(jax.tree_util.tree_map(lambda v: v, negative).tag) == "-0.0"


def test_static_values_of_plain_types_leave_the_layout_pending_until_first_flatten():
    class Tree(tc.TreeClass):
        value: Any
        index: int = tc.field(static=True)

    tree = Tree(1.0, index=123456)
    assert not _node.live_layouts(Tree)  # nothing interned yet
    with pytest.raises(AttributeError, match="immutable"):
        tree.value = 2.0  # sealed all the same
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    assert leaves == [1.0] and len(_node.live_layouts(Tree)) == 1
    assert jax.tree_util.tree_unflatten(treedef, [2.0]).index == 123456
    assert tree._tc_layout is jax.tree_util.tree_flatten(Tree(0.0, index=123456))[1].node_data()[1]
    assert jax.jit(lambda t: t.value * t.index)(tree) == 123456.0


def test_static_values_of_other_types_are_checked_in_init():
    class Tree(tc.TreeClass):
        index: Any = tc.field(static=True)

    with pytest.raises(TypeError, match=r"Static field `Tree\.index` must be hashable"):
        Tree([1])
    assert Tree((1, 2.0)).index == (1, 2.0)


def test_equal_static_values_share_one_layout_and_unused_layouts_are_dropped():
    import gc

    class Tree(tc.TreeClass):
        value: Any
        tag: Any = tc.field(static=True)

    trees = [Tree(1.0, tag=i) for i in range(4)]
    again = Tree(2.0, tag=3)
    # interned: JAX hashes layouts by identity, so equal ones must be the same object
    assert again._tc_layout is trees[3]._tc_layout
    assert hash(jax.tree_util.tree_structure(again)) == hash(jax.tree_util.tree_structure(trees[3]))
    del trees[:3]
    gc.collect()
    assert sorted(key[1][0][1] for key in _node.live_layouts(Tree).keys()) == [3]

    traces = []

    @jax.jit
    def run(tree):
        traces.append(tree.tag)
        return tree.value

    run(trees[0])
    run(again)
    assert traces == [3]


def test_jit_does_not_retrace_for_equal_static_values_and_retraces_on_change():
    traces = []

    @jax.jit
    def step(tree):
        traces.append(tree.tag)
        return tree.value * 2

    step(WithStatic(jnp.ones(2), tag=("relu", 3)))
    step(WithStatic(jnp.zeros(2), tag=tuple(["relu", 3])))  # equal, distinct object
    assert len(traces) == 1
    step(WithStatic(jnp.ones(2), tag=("tanh", 3)))
    assert len(traces) == 2
    step(WithStatic(jnp.ones(2), tag=("relu", 3.0)))  # equal value, other type
    assert len(traces) == 3
    step(WithStatic(jnp.ones(2), tag=("relu", 3)))
    assert len(traces) == 3


def test_jit_retraces_for_hand_written_static_change():
    class Tree(tc.TreeClass):
        mode: str = tc.field(static=True)

        def __init__(self, value, mode):
            self.value = value
            self.mode = mode

    traces = []

    @jax.jit
    def run(tree):
        traces.append(tree.mode)
        return tree.value + 1

    run(Tree(jnp.ones(1), "train"))
    run(Tree(jnp.ones(1), "train"))
    run(Tree(jnp.ones(1), "eval"))
    assert traces == ["train", "eval"]


def test_static_field_in_jit_output_is_kept():
    out = jax.jit(lambda t: t)(WithStatic(jnp.ones(1), tag="out"))
    assert out.tag == "out"


# -- immutability -------------------------------------------------------------------------------


def test_setattr_raises_showing_the_at_fix():
    tree = Point(1.0)
    with pytest.raises(
        AttributeError,
        match=r"Cannot set attribute 'x' of an immutable `Point`"
        r" instance",
    ) as info:
        tree.x = 2.0
    message = str(info.value)
    assert "before: tree.x = value" in message
    assert "after:  tree = tree.at['x'].set(value)" in message
    assert "tree.at['method_name'](*args, **kwargs)" in message
    assert tree.x == 1.0


def test_setattr_of_new_attribute_raises():
    tree = Point(1.0)
    with pytest.raises(AttributeError, match=r"Cannot set attribute 'new'.*\n.*\n.*\.at\['new'\]"):
        tree.new = 1
    assert "new" not in vars(tree)


def test_delattr_raises_showing_the_at_fix():
    tree = Point(1.0)
    with pytest.raises(
        AttributeError,
        match=r"Cannot delete attribute 'x' of an immutable "
        r"`Point`",
    ) as info:
        del tree.x
    assert "before: del tree.x" in str(info.value)
    assert ".at['x']" in str(info.value)
    assert tree.x == 1.0


def test_setattr_on_field_with_on_getattr_raises():
    class Tree(tc.TreeClass):
        a: float = tc.field(on_getattr=abs)

    tree = Tree(-1.0)
    with pytest.raises(AttributeError, match="Cannot set attribute 'a'.*`Tree`"):
        tree.a = 2.0
    with pytest.raises(AttributeError, match="Cannot delete attribute 'a'.*`Tree`"):
        del tree.a


def test_calling_generated_init_again_raises():
    tree = Point(1.0)
    with pytest.raises(
        AttributeError,
        match=r"Cannot call `__init__` again on an immutable "
        r"`Point` instance.*\n.*\n.*tree = Point\(\.\.\.\)",
    ):
        tree.__init__(5.0)
    assert tree.x == 1.0


def test_calling_hand_written_init_again_raises():
    model = MLP([2, 1])
    with pytest.raises(AttributeError, match="Cannot set attribute 'layers' of an immutable"):
        model.__init__([3, 1])
    assert model.layers[0].weight.shape == (2, 1)


def test_generated_init_works_on_a_bare_new_instance():
    tree = Point.__new__(Point)
    tree.__init__(2.0)
    assert vars(tree) == {"x": 2.0, "y": 0.0}


def test_setstate_on_sealed_instance_raises():
    tree = Point(1.0)
    with pytest.raises(
        AttributeError,
        match=r"Cannot call `__setstate__` on an immutable "
        r"`Point` instance",
    ):
        tree.__setstate__({"x": 2.0, "y": 0.0})
    assert tree.x == 1.0


@pytest.mark.parametrize("slots", [("a",), ("a", "b")])
def test_slots_in_subclass_raise_at_definition(slots):
    with pytest.raises(TypeError, match=r"`Tree` defines `__slots__`.*Remove `__slots__`"):

        class Tree(tc.TreeClass):
            __slots__ = slots
            a: int


def test_dict_slot_in_subclass_raises_at_definition():
    with pytest.raises(TypeError, match="__dict__"):  # Python's own check: TreeClass has one

        class Tree(tc.TreeClass):
            __slots__ = ("b", "__dict__")
            a: int


def test_empty_slots_in_subclass_are_harmless():
    class Tree(tc.TreeClass):
        __slots__ = ()
        a: int

    assert jax.tree_util.tree_leaves(Tree(1)) == [1] and vars(Tree(2)) == {"a": 2}


def test_empty_slots_allowed_when_a_base_provides_dict():
    class Plain:
        pass

    class Tree(tc.TreeClass, Plain):
        __slots__ = ()
        a: int = 1

    assert jax.tree_util.tree_leaves(Tree()) == [1]


def test_attributes_may_be_reassigned_and_deleted_inside_init():
    class Tree(tc.TreeClass):
        def __init__(self):
            self.a = 1
            self.a = 2
            self.tmp = 3
            del self.tmp

    assert vars(Tree()) == {"a": 2}


def test_delattr_of_missing_attribute_inside_init_raises():
    class Tree(tc.TreeClass):
        def __init__(self):
            del self.ghost

    with pytest.raises(AttributeError, match="`Tree` instance has no attribute 'ghost'"):
        Tree()


def test_nested_instances_are_each_immutable():
    model = _mlp()
    with pytest.raises(AttributeError, match="immutable `Linear` instance"):
        model.layers[0].weight = 0
    with pytest.raises(AttributeError, match="immutable `MLP` instance"):
        model.layers = ()


def test_instance_built_inside_another_init_is_sealed_before_outer_finishes():
    seen = []

    class Inner(tc.TreeClass):
        a: int = 1

    class Outer(tc.TreeClass):
        def __init__(self):
            self.inner = Inner()
            try:
                self.inner.a = 2
            except AttributeError:
                seen.append("inner sealed")
            self.b = 3  # the outer one is still under construction

    Outer()
    assert seen == ["inner sealed"]


_escaped: list[Any] = []


def test_init_raising_leaves_escaped_instance_immutable():
    class Leaky(tc.TreeClass):
        def __init__(self):
            _escaped.append(self)
            self.a = 1
            raise RuntimeError("boom")

    _escaped.clear()
    with pytest.raises(RuntimeError, match="boom"):
        Leaky()
    (half_built,) = _escaped
    with pytest.raises(AttributeError, match="immutable `Leaky` instance"):
        half_built.a = 2
    with pytest.raises(AttributeError, match="immutable `Leaky` instance"):
        del half_built.a


def test_post_init_raising_leaves_escaped_instance_immutable():
    class Leaky(tc.TreeClass):
        a: int

        def __post_init__(self):
            _escaped.append(self)
            raise ValueError("bad a")

    _escaped.clear()
    with pytest.raises(ValueError, match="bad a"):
        Leaky(1)
    with pytest.raises(AttributeError, match="immutable `Leaky` instance"):
        _escaped[0].a = 2


def test_unhashable_static_after_init_leaves_escaped_instance_immutable():
    class Leaky(tc.TreeClass):
        config: Any = tc.field(static=True)

        def __post_init__(self):
            _escaped.append(self)

    _escaped.clear()
    with pytest.raises(TypeError, match=r"Static field `Leaky\.config` must be hashable"):
        Leaky([1])
    with pytest.raises(AttributeError, match="immutable `Leaky` instance"):
        _escaped[0].config = (1,)


def test_threads_building_at_once_one_inside_slow_init():
    entered, release = threading.Event(), threading.Event()
    half_built: list[Any] = []
    results: dict[str, Any] = {}

    class Slow(tc.TreeClass):
        def __init__(self, slow):
            self.a = 1
            if slow:
                half_built.append(self)
                entered.set()
                assert release.wait(timeout=30)
            self.b = 2  # must still be allowed after other threads sealed their instances

    def build_slow():
        results["slow"] = Slow(slow=True)

    def build_fast():
        results["fast"] = Slow(slow=False)

    slow_thread = threading.Thread(target=build_slow)
    slow_thread.start()
    assert entered.wait(timeout=30)
    fast_thread = threading.Thread(target=build_fast)
    fast_thread.start()
    fast_thread.join(timeout=30)
    # the fast one finished (and is sealed) while the slow one is still inside __init__
    with pytest.raises(AttributeError, match="immutable `Slow` instance"):
        results["fast"].a = 5
    assert "slow" not in results and vars(half_built[0]) == {"a": 1}
    release.set()
    slow_thread.join(timeout=30)
    assert vars(results["slow"]) == {"a": 1, "b": 2}
    with pytest.raises(AttributeError, match="immutable `Slow` instance"):
        results["slow"].a = 5


def test_many_threads_building_nested_instances():
    def build(i):
        model = MLP([2, 3, 1], key=i)
        for node in (model, *model.layers):
            with pytest.raises(AttributeError, match="immutable"):
                node.extra = 0
        return float(model.layers[0].weight[0, 0])

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert list(pool.map(build, range(64))) == [float(i) for i in range(64)]


# -- dunders ------------------------------------------------------------------------------------


def test_repr_names_class_and_fields():
    text = repr(Point(1.0, 2.0))
    assert text.startswith("Point(")
    assert "x=" in text and "y=" in text


def test_repr_false_field_is_hidden():
    class Tree(tc.TreeClass):
        a: float = 1.0
        b: float = tc.field(default=2.0, repr=False)

    assert "a=" in repr(Tree()) and "b=" not in repr(Tree())
    assert "b=" not in str(Tree())


def test_str_names_class():
    assert "Point" in str(Point(1.0))


def test_eq_is_structural():
    assert Point(1.0, 2.0) == Point(1.0, 2.0)
    assert Point(1.0, 2.0) != Point(1.0, 3.0)
    assert Point(jnp.ones(2)) == Point(jnp.ones(2))
    assert Point(jnp.ones(2)) != Point(jnp.ones(3))  # shape
    assert Point(jnp.ones(2)) != Point(jnp.ones(2, dtype=jnp.int32))  # dtype
    assert Point(jnp.ones(2)) != Point(jnp.array([1.0, 0.0]))  # values
    assert Point(jnp.ones(())) == Point(1.0)  # leaves compare by value (as PyTreeClass)
    assert Point(1, 0.0) == Point(1, jnp.zeros(3))  # a number stands for a filled array
    assert Point(1, 0.0) != Point(1, jnp.array([0.0, 1.0]))


def test_eq_false_for_other_class_or_structure():
    class Other(tc.TreeClass):
        x: Any
        y: Any = 0.0

    assert Point(1.0) != Other(1.0)
    assert Point(1.0) != (1.0, 0.0)
    assert Point((1.0, 2.0)) != Point(1.0)
    assert Point(1.0) != 1.0


def test_eq_under_jit_returns_traced_bool():
    seen = []

    @jax.jit
    def same(a, b):
        result = a == b
        seen.append(isinstance(result, jax.core.Tracer))
        return result

    assert bool(same(Point(jnp.ones(2)), Point(jnp.ones(2))))
    assert not bool(same(Point(jnp.ones(2)), Point(jnp.zeros(2))))
    assert seen == [True]


def test_hash_consistent_with_eq():
    assert Point(1, (2.0, "a")) == Point(1, (2.0, "a"))
    assert hash(Point(1, (2.0, "a"))) == hash(Point(1, (2.0, "a")))
    assert {Point(1, (2.0, "a")): "found"}[Point(1, (2.0, "a"))] == "found"


def test_hash_of_unhashable_leaf_names_key_path():
    model = MLP([2, 1])
    with pytest.raises(
        TypeError,
        match=r"leaf at MLP\.layers\[0\]\.weight is an unhashable "
        r"ArrayImpl.*tc\.freeze",
    ):
        hash(model)
    with pytest.raises(TypeError, match=r"leaf at Point\.x is an unhashable ndarray"):
        hash(Point(np.ones(2)))


def test_copy_is_shallow_same_layout_and_immutable():
    model = _mlp()
    copied = copy.copy(model)
    assert copied is not model and copied == model
    assert copied.layers is model.layers
    assert copied._tc_layout is model._tc_layout
    with pytest.raises(AttributeError, match="immutable `MLP` instance"):
        copied.scale = 2.0


def test_deepcopy_round_trip_is_equal_independent_and_immutable():
    model = _mlp()
    copied = copy.deepcopy(model)
    assert copied == model
    assert copied.layers[0] is not model.layers[0]
    assert copied.layers[0].name == "layer0"
    with pytest.raises(AttributeError, match="immutable `Linear` instance"):
        copied.layers[0].bias = 0


def test_pickle_round_trip():
    model = _mlp()
    restored = pickle.loads(pickle.dumps(model))
    assert type(restored) is MLP and restored == model
    assert restored.layers[1].name == "layer1"
    assert jax.tree_util.tree_structure(restored) == jax.tree_util.tree_structure(model)
    with pytest.raises(AttributeError, match="immutable `Linear` instance"):
        restored.layers[0].weight = 0


def test_pickle_round_trip_keeps_static_type():
    restored = pickle.loads(pickle.dumps(WithStatic(1.0, tag=True)))
    assert restored.tag is True
    assert restored == WithStatic(1.0, tag=True)


def test_abstractmethod_prevents_instantiation():
    class Base(tc.TreeClass):
        @abc.abstractmethod
        def __call__(self, x): ...

    class Concrete(Base):
        a: float = 1.0

        def __call__(self, x):
            return self.a * x

    with pytest.raises(TypeError, match="Can't instantiate abstract class Base"):
        Base()
    assert Concrete()(2.0) == 2.0


def test_user_defined_dunders_win():
    class Tree(tc.TreeClass):
        a: int = 1

        def __repr__(self):
            return "custom repr"

        def __str__(self):
            return "custom str"

        def __eq__(self, other):
            return "custom eq"

        def __hash__(self):
            return 42

    tree = Tree()
    assert (repr(tree), str(tree), tree == 0, hash(tree)) == (
        "custom repr",
        "custom str",
        "custom eq",
        42,
    )


def test_user_defined_init_wins_over_annotations():
    class Tree(tc.TreeClass):
        a: int

        def __init__(self):
            self.a = 7

    assert Tree().a == 7


class _Registry:
    seen: list[tuple[str, Any]] = []

    def __init_subclass__(cls, tag=None, **kwargs):
        super().__init_subclass__(**kwargs)
        _Registry.seen.append((cls.__name__, tag))


def test_init_subclass_kwargs_pass_through_to_mixins():
    _Registry.seen.clear()

    class After(tc.TreeClass, _Registry, tag="after"):
        a: int = 1

    class Before(_Registry, tc.TreeClass, tag="before"):
        a: int = 1

    assert _Registry.seen == [("After", "after"), ("Before", "before")]
    assert jax.tree_util.tree_leaves(After()) == [1] == jax.tree_util.tree_leaves(Before())


def test_unknown_class_keyword_raises():
    with pytest.raises(TypeError, match="takes no keyword arguments"):

        class Tree(tc.TreeClass, bogus=1):
            pass


def test_leafwise_class_keyword_is_accepted():
    # the leafwise operators are built elsewhere; until then a clear NotImplementedError
    try:

        class Tree(tc.TreeClass, leafwise=True):
            a: float = 1.0

    except NotImplementedError as error:
        assert "leafwise" in str(error)
    else:
        assert jax.tree_util.tree_leaves(Tree()) == [1.0]


def test_instances_support_weakrefs():
    tree = Point(1.0)
    assert weakref.ref(tree)() is tree


def test_unsealed_copy_is_mutable_and_reseal_freezes_again():
    model = _mlp()
    work = _node.unsealed_copy(model)
    work.scale = 3.0
    work.layers[0].name = "changed"
    _node.reseal(work)
    assert (model.scale, model.layers[0].name) == (1.0, "layer0")
    assert (work.scale, work.layers[0].name) == (3.0, "changed")
    assert jax.tree_util.tree_structure(work) != jax.tree_util.tree_structure(model)
    with pytest.raises(AttributeError, match="immutable `Linear` instance"):
        work.layers[0].name = "again"


# -- replace -----------------------------------------------------------------------------------


class _Optimizer(tc.TreeClass):
    lr: float = tc.field(default=1e-3, on_setattr=[float])
    steps: Any = 0
    name: str = tc.field(default="adam", static=True)


def _positive(x):
    if x <= 0:
        raise ValueError(f"must be positive, got {x}")
    return x


def test_replace_changes_the_named_fields_and_leaves_the_original():
    opt = _Optimizer()
    new = opt.replace(lr=0.5, steps=jnp.ones(2))
    assert type(new) is _Optimizer and new.lr == 0.5 and new.steps.tolist() == [1.0, 1.0]
    assert (opt.lr, opt.steps) == (1e-3, 0)
    assert jax.tree_util.tree_structure(new) == jax.tree_util.tree_structure(opt)


def test_replace_puts_a_number_as_given_where_set_fills_the_array():
    # replace is construction (surgery); .at[...].set is an edit that keeps the leaf's role
    class Layer(tc.TreeClass):
        bias: jax.Array

    layer = Layer(jnp.ones(3))
    assert type(layer.replace(bias=0.0).bias) is float
    filled = layer.at["bias"].set(0.0).bias
    assert isinstance(filled, jax.Array) and filled.tolist() == [0.0, 0.0, 0.0]


def test_replace_runs_the_fields_on_setattr_converters():
    new = _Optimizer().replace(lr=1)
    assert new.lr == 1.0 and type(new.lr) is float


def test_replace_error_of_a_validator_names_the_field():
    class Tree(tc.TreeClass):
        rate: float = tc.field(default=1.0, on_setattr=[_positive])

    with pytest.raises(ValueError, match=r"Tree\.rate.*must be positive, got -1"):
        Tree().replace(rate=-1)


def test_replace_runs_validators_where_at_set_does_not():
    class Tree(tc.TreeClass):
        rate: float = tc.field(default=1.0, on_setattr=[_positive])

    assert Tree().at["rate"].set(-1.0).rate == -1.0  # structural: no validation
    with pytest.raises(ValueError, match="must be positive"):
        Tree().replace(rate=-1.0)


def test_replace_with_an_unknown_name_names_the_closest():
    with pytest.raises(TypeError, match=r"`_Optimizer.replace` got 'lrr'.*Did you mean 'lr'\?"):
        _Optimizer().replace(lrr=0.1)


def test_replace_of_a_static_field_gets_the_layout_of_the_new_value():
    new = _Optimizer().replace(name="sgd")
    fresh = _Optimizer(name="sgd")
    assert new.name == "sgd"
    assert jax.tree_util.tree_structure(new) == jax.tree_util.tree_structure(fresh)
    assert jax.tree_util.tree_structure(new) != jax.tree_util.tree_structure(_Optimizer())
    assert jax.jit(lambda t: t.steps + 1)(new) == 1
    with pytest.raises(AttributeError, match="immutable"):
        new.lr = 2.0


def test_replace_refuses_an_unhashable_static_value():
    with pytest.raises(TypeError, match="must be hashable"):
        _Optimizer().replace(name=["not", "hashable"])


def test_replace_works_with_a_hand_written_init_and_runs_neither_init_nor_post_init():
    calls = []

    class Model(tc.TreeClass):
        def __init__(self, width):
            calls.append("init")
            self.weight = jnp.ones(width)
            self.width = width

        def __post_init__(self):
            calls.append("post_init")

    model = Model(2)
    new = model.replace(weight=jnp.zeros(3))
    assert calls == ["init"] and new.weight.tolist() == [0.0, 0.0, 0.0] and new.width == 2
    assert model.weight.tolist() == [1.0, 1.0]


def test_replace_is_what_copy_replace_calls():
    new = _Optimizer().__replace__(lr=2)
    assert new.lr == 2.0
    if hasattr(copy, "replace"):  # Python 3.13+
        assert copy.replace(_Optimizer(), lr=3).lr == 3.0


def test_a_field_named_replace_is_refused_in_a_treeclass_only():
    with pytest.raises(ValueError, match="cannot be named 'replace'.*hide the `.replace`"):

        class Tree(tc.TreeClass):
            replace: int = 1

    @tc.autoinit
    class Plain:  # no `replace` method to hide
        replace: int = 1

    class Aliased(tc.TreeClass):
        value: int = tc.field(alias="replace")

    assert Plain().replace == 1 and Aliased(replace=2).value == 2


def test_an_attribute_named_replace_hides_the_method_but_copy_replace_reaches_it():
    class Tree(tc.TreeClass):
        def __init__(self):
            self.replace = "a value"
            self.k = 1

    tree = Tree()
    assert tree.replace == "a value"
    assert tc.TreeClass.replace(tree, k=2).k == 2 and tree.__replace__(k=3).k == 3


# -- typing ------------------------------------------------------------------------------------


def test_treeclass_carries_dataclass_transform_with_field_specifier():
    transform = TreeClass.__dataclass_transform__
    assert tc.field in transform["field_specifiers"]
    assert transform["frozen_default"] is True  # instances are immutable
    assert Point.__dataclass_transform__ is transform


def test_autoinit_carries_dataclass_transform_with_field_specifier():
    assert tc.field in tc.autoinit.__dataclass_transform__["field_specifiers"]


def test_py_typed_is_shipped():
    assert (importlib.resources.files("treeclass") / "py.typed").is_file()
    pyproject = pathlib.Path(__file__).parents[1] / "pyproject.toml"
    # hatchling's wheel holds every file of the packages it lists, py.typed included
    # (tomllib is 3.11+, so read the text)
    section = pyproject.read_text().split("[tool.hatch.build.targets.wheel]")[1].split("\n[")[0]
    assert 'packages = ["treeclass"]' in section


# -- properties ---------------------------------------------------------------------------------

_names = st.from_regex(r"[a-z][a-z0-9_]{0,5}", fullmatch=True).filter(
    lambda n: not keyword.iskeyword(n) and n != "at"
)
_scalars = st.one_of(
    st.integers(-5, 5), st.floats(allow_nan=False, width=32), st.booleans(), st.text(max_size=2)
)
_static_values = st.one_of(_scalars, st.tuples(_scalars, _scalars), st.none())
_leaf_values = st.one_of(
    _scalars,
    st.lists(st.floats(-10, 10, width=32), min_size=1, max_size=3).map(jnp.asarray),
    st.tuples(_scalars, _scalars),
)


def _make_class(specs):
    """A TreeClass built with `types.new_class` from `(name, static)` pairs."""

    def body(namespace):
        namespace["__annotations__"] = {name: "Any" for name, _ in specs}
        for name, static in specs:
            namespace[name] = tc.field(static=static)

    return types.new_class("Generated", (tc.TreeClass,), exec_body=body)


@st.composite
def _generated_trees(draw):
    names = draw(st.lists(_names, unique=True, max_size=6))
    specs = [(name, draw(st.booleans())) for name in names]
    values = {name: draw(_static_values if static else _leaf_values) for name, static in specs}
    return _make_class(specs)(**values), specs


@settings(max_examples=40, deadline=None)
@given(_generated_trees())
def test_flatten_unflatten_round_trip_over_generated_classes(generated):
    tree, specs = generated
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    rebuilt = jax.tree_util.tree_unflatten(treedef, leaves)
    assert type(rebuilt) is type(tree)
    assert list(vars(rebuilt)) == [name for name, _ in specs]
    assert rebuilt == tree
    for name, static in specs:
        if static:
            assert type(getattr(rebuilt, name)) is type(getattr(tree, name))
            assert getattr(rebuilt, name) == getattr(tree, name)
    with pytest.raises(AttributeError, match="immutable"):
        rebuilt.extra = 0


@settings(max_examples=40, deadline=None)
@given(_generated_trees())
def test_keyed_flatten_names_every_leaf_field(generated):
    tree, specs = generated
    paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    leaf_fields = [name for name, static in specs if not static]
    assert [path[0] for path in paths] == [
        GetAttrKey(name)
        for name in leaf_fields
        for _ in jax.tree_util.tree_leaves(getattr(tree, name))
    ]


@settings(max_examples=30, deadline=None)
@given(_generated_trees())
def test_tree_map_identity_preserves_structure_and_static_values(generated):
    tree, _ = generated
    mapped = jax.tree_util.tree_map(lambda v: v, tree)
    assert jax.tree_util.tree_structure(mapped) == jax.tree_util.tree_structure(tree)
    assert mapped == tree


_small = st.one_of(st.integers(0, 2), st.sampled_from([0.0, 1.0, 2.0]), st.booleans())


@settings(max_examples=60, deadline=None)
@given(_small, _small, _small, _small)
def test_equal_trees_hash_equal(a, b, tag_a, tag_b):
    first, second = WithStatic((a, 1), tag=tag_a), WithStatic((b, 1), tag=tag_b)
    equal = first == second
    assert equal is tc.is_tree_equal(first, second)
    if equal:
        assert hash(first) == hash(second)
    if not (type(tag_a) is type(tag_b) and tag_a == tag_b):
        assert not equal  # a different static value is a different tree


# -- who seals: the outermost __init__ ---------------------------------------------------


def test_init_from_a_plain_mixin_seals_the_instance():
    class Mixin:
        def __init__(self, value):
            self.value = value

    class Tree(tc.TreeClass, Mixin):
        pass

    class Reversed(Mixin, tc.TreeClass):
        pass

    for cls in (Tree, Reversed):
        tree = cls(3)
        assert jax.tree_util.tree_leaves(tree) == [3]
        with pytest.raises(AttributeError, match="immutable"):
            tree.value = 4


def test_inherited_hand_written_init_seals_the_subclass_instance():
    class Parent(tc.TreeClass):
        def __init__(self, n):
            self.items = tuple(range(n))

    class Child(Parent):
        pass

    child = Child(2)
    assert jax.tree_util.tree_leaves(child) == [0, 1]
    with pytest.raises(AttributeError, match="immutable `Child` instance"):
        child.items = ()


def test_parent_hand_written_init_called_through_super_does_not_seal_early():
    class Parent(tc.TreeClass):
        def __init__(self):
            self.a = 1

    class Child(Parent):
        def __init__(self):
            super().__init__()
            self.b = 2  # would raise if the parent's __init__ had sealed

    child = Child()
    assert jax.tree_util.tree_flatten_with_path(child)[0] == [
        ((jax.tree_util.GetAttrKey("a"),), 1),
        ((jax.tree_util.GetAttrKey("b"),), 2),
    ]
    with pytest.raises(AttributeError, match="immutable"):
        child.a = 0


def test_flatten_inside_post_init_sees_the_attributes_set_so_far():
    seen = []

    class Tree(tc.TreeClass):
        a: int = 1

        def __post_init__(self):
            seen.append(jax.tree_util.tree_leaves(self))
            self.b = 2

    tree = Tree()
    assert seen == [[1]]
    assert jax.tree_util.tree_leaves(tree) == [1, 2]


class _StaticTagged(tc.TreeClass):  # module level: pickle finds classes by name
    value: Any
    tag: str = tc.field(static=True)


def test_pickled_treedef_comes_back_with_the_interned_layout():
    # layouts hash by identity (JAX hashes aux data on every dispatch), so a layout that
    # comes back from pickle must be the interned one, or equal treedefs would hash apart
    tree = _StaticTagged(1.0, tag="a")
    treedef = jax.tree_util.tree_structure(tree)
    again = pickle.loads(pickle.dumps(treedef))
    assert again == treedef and hash(again) == hash(treedef)
    assert pickle.loads(pickle.dumps(tree._tc_layout)) is tree._tc_layout


def test_a_failed_init_leaves_a_sealed_instance_behind():
    escaped = []

    class Tree(tc.TreeClass):
        def __init__(self):
            escaped.append(self)
            self.a = 1
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        Tree()
    with pytest.raises(AttributeError, match="immutable"):
        escaped[0].a = 2
