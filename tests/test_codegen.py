"""Tests for generated code (treeclass/_codegen.py): the `__init__` of a class and the
unflatten of a layout, their source in tracebacks, the `linecache` entries, error paths."""

from __future__ import annotations

import gc
import inspect
import linecache
import traceback
import types
from typing import Any

import jax
import pytest

import treeclass as tc
from treeclass._codegen import compile_function


class Point(tc.TreeClass):
    x: Any
    y: Any = 0.0


class Tagged(tc.TreeClass):
    x: Any
    tag: str = tc.field(default="a", static=True)


def _new_class(name: str, annotations: dict[str, Any], base: type = tc.TreeClass) -> type:
    # as a notebook cell defines a class: same qualified name each time it runs
    return types.new_class(
        name, (base,), exec_body=lambda ns: ns.update({"__annotations__": annotations})
    )


# -- the generated __init__ ------------------------------------------------------------------


def test_generated_init_has_source_a_traceback_shows():
    def positive(x):
        if x <= 0:
            raise ValueError("must be positive")
        return x

    class Scaled(tc.TreeClass):
        scale: float = tc.field(on_setattr=[positive])
        name: str = tc.field(default="s", static=True)

    source = inspect.getsource(Scaled.__init__)
    assert source.startswith("def __init__(self, scale, name=")
    assert "__tc_state['scale']" in source
    with pytest.raises(ValueError) as info:
        Scaled(-1.0)
    frames = [
        f
        for f in traceback.extract_tb(info.value.__traceback__)
        if f.filename.startswith("<treeclass __init__ of")
    ]
    assert frames and f"{Scaled.__qualname__}" in frames[0].filename
    assert frames[0].line  # the line's text comes from linecache


def test_a_failing_on_setattr_names_the_field_it_was_setting():
    def positive(x):
        if x <= 0:
            raise ValueError("must be positive")
        return x

    class Rate(tc.TreeClass):
        rate: float = tc.field(on_setattr=[positive])

    with pytest.raises(ValueError, match=r"while setting field `Rate.rate` \(its on_setattr\)"):
        Rate(-1.0)


def test_generated_init_of_a_plain_autoinit_class_assigns_through_setattr():
    @tc.autoinit
    class Plain:
        a: int = tc.field(on_setattr=[int])
        b: int = 2

    source = inspect.getsource(Plain.__init__)
    assert "self.a = a" in source and "self.b = b" in source
    assert "__tc_state" not in source  # no direct store, no sealing
    assert Plain(1.5).a == 1


def test_generated_init_without_fields_does_nothing():
    @tc.autoinit
    class Empty:
        pass

    assert inspect.getsource(Empty.__init__) == "def __init__(self):\n    pass\n"
    assert vars(Empty()) == {}


def test_factory_values_are_made_per_instance_and_only_when_not_given():
    calls = []

    def make():
        calls.append(1)
        return (len(calls),)

    class Tree(tc.TreeClass):
        items: tuple = tc.field(factory=make)

    assert Tree().items == (1,) and Tree().items == (2,)
    assert Tree(items=("given",)).items == ("given",)
    assert len(calls) == 2


def test_fields_not_in_init_are_set_from_their_default_or_factory():
    class Tree(tc.TreeClass):
        a: int
        b: int = tc.field(default=5, init=False)
        c: tuple = tc.field(factory=lambda: (1,), init=False)

    assert "b" not in inspect.signature(Tree.__init__).parameters
    assert vars(Tree(1)) == {"a": 1, "b": 5, "c": (1,)}


def test_var_kw_field_is_stored_as_a_fresh_dict():
    class Tree(tc.TreeClass):
        options: dict = tc.field(kind="VAR_KW")

    given = {"lr": 0.1}
    tree = Tree(**given)
    assert dict(tree.options) == given and type(tree.options) is dict


def test_an_unhashable_static_value_fails_in_init_naming_the_field_and_seals():
    class Tree(tc.TreeClass):
        tag: Any = tc.field(static=True)

    escaped = []

    class Keeper(Tree):
        def __post_init__(self):
            escaped.append(self)

    with pytest.raises(TypeError, match=r"`Tree.tag` must be hashable"):
        Tree(["a", "list"])
    with pytest.raises(TypeError, match="must be hashable"):
        Keeper(["a"])
    with pytest.raises(AttributeError, match="immutable"):
        escaped[0].tag = "x"


def test_calling_a_generated_init_again_is_refused_and_changes_nothing():
    point = Point(1.0, 2.0)
    with pytest.raises(AttributeError, match=r"Cannot call `__init__` again"):
        point.__init__(3.0, 4.0)
    assert (point.x, point.y) == (1.0, 2.0)


def test_a_parents_generated_init_reached_through_super_leaves_sealing_to_the_child():
    class Child(Point):
        def __init__(self, x):
            super().__init__(x, y=-1.0)
            self.z = x * 2  # still being built: the parent's __init__ did not seal

    child = Child(2.0)
    assert (child.x, child.y, child.z) == (2.0, -1.0, 4.0)
    with pytest.raises(AttributeError, match="immutable"):
        child.z = 0


# -- the generated unflatten -----------------------------------------------------------------


def test_generated_unflatten_has_source_in_linecache():
    leaves, treedef = jax.tree_util.tree_flatten(Point(1.0, 2.0))
    layout = treedef.node_data()[1]
    build = layout.build
    filename = build.__code__.co_filename
    assert filename.startswith("<treeclass unflatten of") and "Point(x, y)" in filename
    assert "def build(layout, children):" in "".join(linecache.getlines(filename))
    assert jax.tree_util.tree_unflatten(treedef, [3.0, 4.0]) == Point(3.0, 4.0)


def test_unflatten_reads_static_values_from_the_layout():
    tree = Tagged(1.0, tag="kept")
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    back = jax.tree_util.tree_unflatten(treedef, [2.0])
    assert (back.x, back.tag) == (2.0, "kept")
    assert list(vars(back)) == ["x", "tag"]  # attribute order kept


def test_unflatten_of_another_attribute_order_than_the_class_s_own():
    class Grown(tc.TreeClass):
        a: Any

        def __post_init__(self):
            if self.a == "grow":
                self.b = 1.0

    plain, grown = Grown(0.0), Grown("grow")
    for tree in (plain, grown):
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        back = jax.tree_util.tree_unflatten(treedef, leaves)
        assert vars(back) == vars(tree)


# -- compiling and linecache -----------------------------------------------------------------


def test_a_redefined_class_keeps_the_source_of_both_inits():
    first, second = _new_class("Tree", {"a": int}), _new_class("Tree", {"b": int})
    assert first.__init__.__code__.co_filename != second.__init__.__code__.co_filename
    assert inspect.getsource(first.__init__).startswith("def __init__(self, a)")
    assert inspect.getsource(second.__init__).startswith("def __init__(self, b)")
    assert first(1).a == 1 and second(2).b == 2


def test_the_same_code_under_the_same_label_shares_its_filename():
    first, second = _new_class("Same", {"a": int}), _new_class("Same", {"a": int})
    assert first.__init__.__code__.co_filename == second.__init__.__code__.co_filename


def test_compiled_function_runs_in_its_namespace_and_names_its_label():
    source = "def scaled(x):\n    return x * factor\n"
    scaled = compile_function(source, "scaled", {"factor": 3}, "test scaled")
    assert scaled(2) == 6
    assert scaled.__code__.co_filename == "<treeclass test scaled>"
    assert inspect.getsource(scaled) == source


def test_linecache_entry_lives_as_long_as_a_function_compiled_under_it():
    source = "def f():\n    return 1\n"
    first = compile_function(source, "f", {}, "test forget")
    second = compile_function(source, "f", {}, "test forget")
    filename = first.__code__.co_filename
    assert second.__code__.co_filename == filename
    del first
    gc.collect()
    assert linecache.getlines(filename) == source.splitlines(keepends=True)
    del second
    gc.collect()
    assert filename not in linecache.cache


def test_source_that_does_not_compile_raises_naming_its_label():
    with pytest.raises(SyntaxError) as info:
        compile_function("def broken(:\n    pass\n", "broken", {}, "test broken")
    assert info.value.filename == "<treeclass test broken>"
