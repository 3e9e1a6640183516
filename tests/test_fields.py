"""Tests of fields: `field()`, `Field`, `fields()`, the generated `__init__` and `autoinit`."""

from __future__ import annotations

import inspect
import keyword
import types
import typing
import warnings
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treeclass as tc
from treeclass import _node
from treeclass._fields import MISSING


def _params(init) -> str:
    """The signature without annotations: parameter names, kinds and defaults."""
    sig = inspect.signature(init)
    bare = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=bare, return_annotation=inspect.Signature.empty))


# -- defining fields: annotations --------------------------------------------------------


def test_annotated_fields_with_defaults_generate_init_without_decorator():
    class Tree(tc.TreeClass):
        a: float = 1.0
        b: float = 2.0

    tree = Tree()
    assert (tree.a, tree.b) == (1.0, 2.0)
    assert Tree(3.0, b=4.0).b == 4.0


def test_annotated_field_without_default_is_a_required_parameter():
    class Tree(tc.TreeClass):
        a: float

    with pytest.raises(TypeError, match="missing 1 required positional argument: 'a'"):
        Tree()
    assert Tree(5.0).a == 5.0


def test_class_attribute_reads_the_default():
    class Tree(tc.TreeClass):
        a: float = 1.0
        b: int = tc.field(default=3)
        c: int = tc.field(factory=lambda: 4)

    assert Tree.a == 1.0
    assert Tree.b == 3
    assert not isinstance(Tree.__dict__.get("c"), tc.Field)  # no Field left in the class


def test_generated_init_signature_lists_fields_in_order():
    class Tree(tc.TreeClass):
        a: int
        b: int = 2

    assert _params(Tree.__init__) == "(self, a, b=2)"


def test_classvar_string_annotation_is_not_a_field():
    class Tree(tc.TreeClass):
        a: int = 1
        count: ClassVar[int] = 5  # a string annotation here (postponed evaluation)
        other: typing.ClassVar[int] = 6

    assert [f.name for f in tc.fields(Tree)] == ["a"]
    assert Tree.count == 5 and Tree.other == 6
    assert "count" not in vars(Tree())
    assert _params(Tree.__init__) == "(self, a=1)"


def test_classvar_object_annotation_is_not_a_field():
    namespace = {"__annotations__": {"a": int, "count": ClassVar[int]}, "a": 1, "count": 7}
    Tree = types.new_class("Tree", (tc.TreeClass,), exec_body=lambda ns: ns.update(namespace))

    assert [f.name for f in tc.fields(Tree)] == ["a"]
    assert Tree.count == 7
    assert jax.tree_util.tree_leaves(Tree()) == [1]


def test_array_default_is_allowed_and_shared():
    default = jnp.ones(3)

    class Tree(tc.TreeClass):
        w: jax.Array = default

    assert Tree().w is default
    assert Tree(jnp.zeros(2)).w.shape == (2,)


@pytest.mark.parametrize(
    ("value", "kind"), [([], "list"), ({}, "dict"), (set(), "set"), ([1, 2], "list")]
)
def test_mutable_default_raises_pointing_to_factory(value, kind):
    with pytest.raises(
        TypeError, match=rf"Tree\.a: a default of type `{kind}` .*\(it is mutable"
    ) as info:

        class Tree(tc.TreeClass):
            a: Any = value

    assert "tc.field(factory=lambda:" in str(info.value)


def test_mutable_default_given_to_field_raises():
    with pytest.raises(TypeError, match=r"Tree\.items: a default.*\n.*\n.*\n.*field\(factory="):

        class Tree(tc.TreeClass):
            items: list = tc.field(default=[])


def test_mutable_default_raises_on_autoinit_class():
    with pytest.raises(TypeError, match=r"Plain\.d: a default of type `dict` is not allowed"):

        @tc.autoinit
        class Plain:
            d: dict = {}


def test_post_init_runs_after_generated_init():
    calls = []

    class Tree(tc.TreeClass):
        a: int
        b: int = tc.field(init=False)

        def __post_init__(self):
            calls.append(self.a)
            self.b = self.a * 2

    tree = Tree(3)
    assert calls == [3]
    assert tree.b == 6
    with pytest.raises(AttributeError, match="immutable"):
        tree.b = 1


def test_post_init_added_by_subclass_runs():
    class Parent(tc.TreeClass):
        a: int

    class Child(Parent):
        def __post_init__(self):
            self.doubled = self.a * 2

    assert Child(2).doubled == 4
    assert not hasattr(Parent(2), "doubled")


def test_hand_written_init_assigns_unannotated_attributes():
    class Layer(tc.TreeClass):
        w: float

    class Net(tc.TreeClass):
        scale: float  # annotations do not generate an __init__ when one is written

        def __init__(self, n):
            self.conv1 = Layer(1.0)
            self.scale = float(n)
            self.extra = (n, n)

    net = Net(2)
    assert list(vars(net)) == ["conv1", "scale", "extra"]
    assert jax.tree_util.tree_leaves(net) == [1.0, 2.0, 2, 2]
    assert _params(Net.__init__) == "(self, n)"


def test_child_without_fields_inherits_hand_written_init():
    class Parent(tc.TreeClass):
        def __init__(self, x):
            self.x = x

    class Child(Parent):
        def double(self):
            return self.x * 2

    assert Child.__init__ is Parent.__init__
    assert Child(2).double() == 4


def test_child_with_fields_gets_generated_init_over_parent_fields():
    class Parent(tc.TreeClass):
        a: int

    class Child(Parent):
        b: int = 2

    child = Child(1)
    assert (child.a, child.b) == (1, 2)
    assert [f.name for f in tc.fields(Child)] == ["a", "b"]


def test_hand_written_child_init_calls_generated_parent_init():
    class Parent(tc.TreeClass):
        a: int
        b: int = 2

    class Child(Parent):
        def __init__(self, a):
            super().__init__(a, b=a + 1)
            self.c = a + 2

    child = Child(1)
    assert vars(child) == {"a": 1, "b": 2, "c": 3}
    with pytest.raises(AttributeError, match="immutable"):
        child.c = 0


class _Pool(tc.TreeClass):
    """A base layer with a hand-written `__init__` (serket's pooling layers, say)."""

    def __init__(self, kernel_size, *, keepdims=False):
        self.kernel_size = kernel_size
        self.keepdims = keepdims

    def __call__(self, x):
        return x.ndim - self.spatial_ndim


class _Pool2D(_Pool):
    spatial_ndim: int = 2


def test_subclass_adding_annotated_attributes_keeps_the_parents_hand_written_init():
    layer = _Pool2D(kernel_size=3, keepdims=True)
    assert inspect.signature(_Pool2D.__init__) == inspect.signature(_Pool.__init__)
    assert vars(layer) == {"kernel_size": 3, "keepdims": True}
    assert layer.spatial_ndim == 2 and layer(jnp.ones((1, 4, 4))) == 1
    assert jax.tree_util.tree_leaves(layer) == [3, True]  # a class-level default, no leaf
    with pytest.raises(AttributeError, match="immutable"):
        layer.keepdims = False


def test_field_defaults_below_a_hand_written_init_are_class_level_and_overridable():
    class Pool3D(_Pool2D):
        spatial_ndim: int = 3

    class Pool3DAgain(Pool3D):  # a chain of such subclasses keeps the same __init__
        pass

    assert Pool3D(2).spatial_ndim == 3 and Pool3DAgain(2).spatial_ndim == 3
    assert _Pool2D(2).spatial_ndim == 2
    assert [f.name for f in tc.fields(Pool3D)] == ["spatial_ndim"]
    assert Pool3DAgain.__init__ is _Pool.__init__


def test_hand_written_init_may_set_a_field_declared_below_it():
    class Parent(tc.TreeClass):
        a: int = 1

        def __init__(self):
            self.a = 10
            self.b = 20

    class Child(Parent):
        b: int = 2

    assert vars(Child()) == {"a": 10, "b": 20}
    assert Child().b == 20  # the instance's value, not the class default


def test_autoinit_opts_a_subclass_of_a_hand_written_init_into_generation():
    @tc.autoinit
    class Window(_Pool2D):
        stride: int = 1

    window = Window(5, 2)
    assert vars(window) == {"spatial_ndim": 5, "stride": 2}
    assert list(inspect.signature(Window.__init__).parameters) == ["self", "spatial_ndim", "stride"]

    class Below(Window):  # below a generated __init__ again: generated, with the new field
        extra: str = tc.field(default="x", static=True)

    assert vars(Below(1, 2, "y")) == {"spatial_ndim": 1, "stride": 2, "extra": "y"}


def test_generated_parent_then_hand_written_then_annotated_child():
    class Base(tc.TreeClass):
        a: int
        b: int = 2

    class Middle(Base):
        def __init__(self, a):
            super().__init__(a, b=a * 10)

    class Leaf(Middle):
        c: int = 7

    leaf = Leaf(3)
    assert vars(leaf) == {"a": 3, "b": 30}
    assert leaf.c == 7
    with pytest.raises(TypeError):
        Leaf(3, 4)


def test_annotated_subclass_of_a_plain_mixin_with_init_keeps_that_init():
    class Mixin:
        def __init__(self, size):
            self.size = size

    class Tree(Mixin, tc.TreeClass):
        scale: float = 1.0

    tree = Tree(4)
    assert vars(tree) == {"size": 4} and tree.scale == 1.0
    with pytest.raises(AttributeError, match="immutable"):
        tree.size = 5


def test_post_init_below_a_hand_written_init_warns_that_it_will_not_run():
    class Child(_Pool):
        extra: int = 1

        def __post_init__(self):
            raise AssertionError("never called")

    with pytest.warns(UserWarning, match=r"`Child.__post_init__` will not run.*`_Pool`") as seen:
        assert Child(2).kernel_size == 2
        child = Child(2)
    assert seen[0].filename == __file__  # points at the construction
    with pytest.raises(AttributeError, match="immutable"):
        child.kernel_size = 3

    @tc.autoinit
    class Generated(_Pool):
        extra: int = 1

        def __post_init__(self):
            self.doubled = self.extra * 2

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Generated(4).doubled == 8


def test_post_init_with_a_generated_init_runs_without_warning(recwarn):
    class Parent(tc.TreeClass):
        a: int = 1

    class Child(Parent):
        b: int = 2

        def __post_init__(self):
            self.c = self.a + self.b

    assert Child().c == 3
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)]


def test_mixin_annotations_are_not_fields():
    class Mixin:
        hidden: int = 3

    class Tree(tc.TreeClass, Mixin):
        a: int = 1

    assert [f.name for f in tc.fields(Tree)] == ["a"]
    assert jax.tree_util.tree_leaves(Tree()) == [1]


# -- autoinit ------------------------------------------------------------------------------


def test_autoinit_on_treeclass_matches_implicit_init():
    class Implicit(tc.TreeClass):
        a: int
        b: float = 2.0

    @tc.autoinit
    class Explicit(tc.TreeClass):
        a: int
        b: float = 2.0

    assert str(inspect.signature(Implicit.__init__)) == str(inspect.signature(Explicit.__init__))
    assert vars(Implicit(1)) == vars(Explicit(1))


def test_autoinit_is_idempotent():
    class Tree(tc.TreeClass):
        a: int

    init = Tree.__init__
    assert tc.autoinit(tc.autoinit(Tree)) is Tree
    assert Tree.__init__ is init


def test_autoinit_forces_init_when_parent_defines_one():
    class Parent(tc.TreeClass):
        a: int = 0

        def __init__(self):
            self.a = 100

    @tc.autoinit
    class Child(Parent):
        pass

    assert Child(3).a == 3


def test_autoinit_never_replaces_hand_written_init_of_the_class():
    @tc.autoinit
    class Tree(tc.TreeClass):
        a: int

        def __init__(self):
            self.a = 0

    assert Tree().a == 0  # the class's own __init__ runs
    with pytest.raises(TypeError):
        Tree(4)

    @tc.autoinit
    class Plain:
        a: int

        def __init__(self):
            self.a = 1

    assert Plain().a == 1


def test_autoinit_still_generates_when_only_a_parent_defines_init():
    class Parent(tc.TreeClass):
        a: int = 0

        def __init__(self):
            self.a = 5

    @tc.autoinit
    class Child(Parent):
        pass

    assert Child(3).a == 3 and Parent().a == 5


def test_autoinit_on_plain_class():
    @tc.autoinit
    class Point:
        x: float
        y: float = 0.0
        label: str = tc.field(default="p", kind="KW_ONLY")

    point = Point(1.0)
    assert (point.x, point.y, point.label) == (1.0, 0.0, "p")
    assert Point.y == 0.0
    assert _params(Point.__init__) == "(self, x, y=0.0, *, label='p')"
    point.x = 5.0  # a plain class stays mutable
    assert point.x == 5.0
    assert jax.tree_util.tree_leaves(point) == [point]  # and is not a pytree


def test_autoinit_on_plain_class_is_idempotent():
    @tc.autoinit
    class Point:
        x: float = tc.field(factory=lambda: 1.0)

    init = Point.__init__
    assert tc.autoinit(Point) is Point
    assert Point.__init__ is init
    assert Point().x == 1.0


def test_autoinit_plain_class_keeps_field_arguments_in_fields():
    @tc.autoinit
    class Point:
        x: int = tc.field(default=1, alias="x0", metadata={"unit": "m"})
        items: list = tc.field(factory=list)

    x_field, items_field = tc.fields(Point)
    assert x_field.alias == "x0" and x_field.metadata["unit"] == "m"
    assert items_field.factory is list
    assert Point(x0=4).x == 4
    assert Point().items is not Point().items


def test_autoinit_plain_subclass_keeps_parent_aliases_and_factories():
    @tc.autoinit
    class Base:
        x: int = tc.field(default=1, alias="x0")
        items: list = tc.field(factory=list)

    @tc.autoinit
    class Derived(Base):
        z: int = 3

    derived = Derived(x0=5)
    assert vars(derived) == {"x": 5, "items": [], "z": 3}
    assert [f.name for f in tc.fields(Derived)] == ["x", "items", "z"]


def test_autoinit_plain_class_runs_post_init():
    @tc.autoinit
    class Point:
        x: float

        def __post_init__(self):
            self.norm = abs(self.x)

    assert Point(-2.0).norm == 2.0


def test_autoinit_plain_class_var_kind_stays_on_class():
    @tc.autoinit
    class Point:
        x: float
        scale: float = tc.field(default=2.0, kind="CLASS_VAR")
        unset: int = tc.field(kind="CLASS_VAR")

    assert Point.scale == 2.0
    assert not hasattr(Point, "unset")
    assert vars(Point(1.0)) == {"x": 1.0}


def test_autoinit_rejects_a_non_class():
    with pytest.raises(TypeError, match="`autoinit` expects a class, got 3"):
        tc.autoinit(3)


# -- field(default=..., factory=..., init=...) -------------------------------------------------


def test_factory_makes_a_fresh_value_per_instance():
    class Tree(tc.TreeClass):
        items: list = tc.field(factory=list)

    first, second = Tree(), Tree()
    assert first.items == [] and first.items is not second.items
    assert Tree([1]).items == [1]


def test_factory_is_not_called_when_a_value_is_passed():
    calls = []

    class Tree(tc.TreeClass):
        a: int = tc.field(factory=lambda: calls.append(1) or 0)

    Tree(5)
    assert calls == []
    Tree()
    assert calls == [1]


def test_init_false_with_default_is_set_by_init():
    class Tree(tc.TreeClass):
        a: int
        b: int = tc.field(default=7, init=False)

    assert _params(Tree.__init__) == "(self, a)"
    assert vars(Tree(1)) == {"a": 1, "b": 7}


def test_init_false_with_factory_is_set_by_init():
    class Tree(tc.TreeClass):
        b: list = tc.field(factory=list, init=False)

    assert _params(Tree.__init__) == "(self)"
    assert Tree().b == [] and Tree().b is not Tree().b


def test_init_false_without_default_is_left_unset():
    class Tree(tc.TreeClass):
        a: int
        b: int = tc.field(init=False)

    tree = Tree(1)
    assert vars(tree) == {"a": 1}
    with pytest.raises(AttributeError, match="b"):
        _ = tree.b


def test_init_false_field_does_not_count_for_default_ordering():
    class Tree(tc.TreeClass):
        a: int = tc.field(default=1, init=False)
        b: int

    assert vars(Tree(2)) == {"a": 1, "b": 2}


def test_repr_false_is_recorded_on_the_field():
    class Tree(tc.TreeClass):
        a: int = tc.field(default=1, repr=False)

    assert tc.fields(Tree)[0].repr is False


# -- field(kind=...) ---------------------------------------------------------------------------


def test_kind_pos_only_rejects_keyword():
    class Tree(tc.TreeClass):
        a: int = tc.field(kind="POS_ONLY")
        b: int = 2

    assert _params(Tree.__init__) == "(self, a, /, b=2)"
    assert vars(Tree(1, b=3)) == {"a": 1, "b": 3}
    with pytest.raises(TypeError, match="positional-only"):
        Tree(a=1)


def test_kind_pos_only_followed_by_var_pos():
    class Tree(tc.TreeClass):
        a: int = tc.field(kind="POS_ONLY")
        rest: tuple = tc.field(kind="VAR_POS")

    assert _params(Tree.__init__) == "(self, a, /, *rest)"
    assert vars(Tree(1, 2, 3)) == {"a": 1, "rest": (2, 3)}
    assert vars(Tree(1)) == {"a": 1, "rest": ()}


def test_kind_pos_only_with_defaults():
    class Tree(tc.TreeClass):
        a: int = tc.field(kind="POS_ONLY", default=1)
        b: int = tc.field(kind="POS_ONLY", default=2)

    assert _params(Tree.__init__) == "(self, a=1, b=2, /)"
    assert vars(Tree(5)) == {"a": 5, "b": 2}


def test_kind_var_pos_collects_a_tuple_of_leaves():
    class Tree(tc.TreeClass):
        layers: tuple = tc.field(kind="VAR_POS")

    tree = Tree(1.0, 2.0)
    assert tree.layers == (1.0, 2.0)
    assert jax.tree_util.tree_leaves(tree) == [1.0, 2.0]


def test_kind_kw_only_rejects_positional():
    class Tree(tc.TreeClass):
        a: int
        b: int = tc.field(kind="KW_ONLY")

    assert _params(Tree.__init__) == "(self, a, *, b)"
    assert vars(Tree(1, b=2)) == {"a": 1, "b": 2}
    with pytest.raises(TypeError, match="takes 2 positional arguments but 3 were given"):
        Tree(1, 2)


def test_kind_kw_only_mixed_with_defaults():
    # a KW_ONLY field without a default may follow fields with defaults
    class Tree(tc.TreeClass):
        a: int = 1
        b: int = tc.field(kind="KW_ONLY")
        c: int = tc.field(kind="KW_ONLY", default=3)
        d: int = 4

    assert _params(Tree.__init__) == "(self, a=1, d=4, *, b, c=3)"
    assert vars(Tree(b=2)) == {"a": 1, "b": 2, "c": 3, "d": 4}


def test_kind_var_kw_collects_a_dict():
    class Tree(tc.TreeClass):
        a: int
        extra: dict = tc.field(kind="VAR_KW")

    tree = Tree(1, x=2, y=3)
    assert tree.extra == {"x": 2, "y": 3}
    assert jax.tree_util.tree_leaves(tree) == [1, 2, 3]


def test_all_parameter_kinds_together():
    class Tree(tc.TreeClass):
        kw: int = tc.field(kind="KW_ONLY")
        rest: tuple = tc.field(kind="VAR_POS")
        a: int = tc.field(kind="POS_ONLY")
        b: int = tc.field(kind="POS_OR_KW", default=2)
        extra: dict = tc.field(kind="VAR_KW")

    # parameters are ordered by kind as Python requires; attributes keep definition order
    assert _params(Tree.__init__) == "(self, a, /, b=2, *rest, kw, **extra)"
    tree = Tree(1, 3, 4, 5, kw=6, z=7)
    assert vars(tree) == {"kw": 6, "rest": (4, 5), "a": 1, "b": 3, "extra": {"z": 7}}


def test_kind_class_var_is_a_class_attribute_not_an_instance_field():
    class Tree(tc.TreeClass):
        a: int = 1
        scale: float = tc.field(default=2.0, kind="CLASS_VAR")

    assert Tree.scale == 2.0
    assert vars(Tree()) == {"a": 1}
    assert _params(Tree.__init__) == "(self, a=1)"
    assert [(f.name, f.kind) for f in tc.fields(Tree)] == [
        ("a", "POS_OR_KW"),
        ("scale", "CLASS_VAR"),
    ]


def test_kind_class_var_without_default_leaves_no_class_attribute():
    class Tree(tc.TreeClass):
        scale: float = tc.field(kind="CLASS_VAR")

    assert not hasattr(Tree, "scale")
    assert vars(Tree()) == {}


def test_two_var_pos_fields_raise_at_definition():
    with pytest.raises(TypeError, match="Tree: only one field may have kind='VAR_POS'"):

        class Tree(tc.TreeClass):
            a: tuple = tc.field(kind="VAR_POS")
            b: tuple = tc.field(kind="VAR_POS")


def test_two_var_kw_fields_raise_at_definition():
    with pytest.raises(TypeError, match="Tree: only one field may have kind='VAR_KW'"):

        class Tree(tc.TreeClass):
            a: dict = tc.field(kind="VAR_KW")
            b: dict = tc.field(kind="VAR_KW")


def test_field_without_default_after_default_raises_naming_both():
    with pytest.raises(TypeError, match="field 'b' has no default but follows field 'a'"):

        class Tree(tc.TreeClass):
            a: int = 1
            b: int


def test_inherited_default_followed_by_required_field_raises():
    class Parent(tc.TreeClass):
        a: int = 1

    with pytest.raises(TypeError, match="Child: field 'b' has no default.*kind='KW_ONLY'"):

        class Child(Parent):
            b: int


# -- field(alias=...) --------------------------------------------------------------------------


def test_alias_is_the_init_parameter_name():
    class Tree(tc.TreeClass):
        _private: int = tc.field(alias="private")

    tree = Tree(private=3)
    assert vars(tree) == {"_private": 3}
    assert _params(Tree.__init__) == "(self, private)"
    with pytest.raises(TypeError, match="unexpected keyword argument '_private'"):
        Tree(_private=3)


def test_alias_with_default():
    class Tree(tc.TreeClass):
        a: int = tc.field(default=1, alias="alpha")

    assert vars(Tree()) == {"a": 1}
    assert vars(Tree(alpha=2)) == {"a": 2}
    assert vars(Tree(5)) == {"a": 5}


def test_alias_with_factory():
    class Tree(tc.TreeClass):
        a: list = tc.field(factory=list, alias="alpha")

    assert vars(Tree()) == {"a": []}
    assert vars(Tree(alpha=[1])) == {"a": [1]}


def test_alias_on_var_kinds():
    class Tree(tc.TreeClass):
        positional: tuple = tc.field(kind="VAR_POS", alias="args")
        keywords: dict = tc.field(kind="VAR_KW", alias="kwargs")

    assert _params(Tree.__init__) == "(self, *args, **kwargs)"
    assert vars(Tree(1, k=2)) == {"positional": (1,), "keywords": {"k": 2}}


def test_alias_clashing_with_another_field_raises_at_definition():
    with pytest.raises(TypeError, match="fields 'a' and 'b' both use the `__init__` parameter"):

        class Tree(tc.TreeClass):
            a: int = tc.field(alias="b")
            b: int = 2


def test_field_names_that_shadow_generated_code_names_work():
    # names a generated __init__ might use internally must not clash with fields
    class Tree(tc.TreeClass):
        this: int = tc.field(alias="self_")
        dict: dict = tc.field(kind="VAR_KW")

    class Other(tc.TreeClass):
        _d: int = 0
        e: int = tc.field(default=1, on_setattr=int)
        MISSING: int = tc.field(factory=lambda: 2)

    assert vars(Tree(1, x=2)) == {"this": 1, "dict": {"x": 2}}
    assert vars(Other(5, 6.0)) == {"_d": 5, "e": 6, "MISSING": 2}


# -- field(on_setattr=..., on_getattr=...) -------------------------------------------------------


def test_on_setattr_converts_in_generated_init():
    class Tree(tc.TreeClass):
        a: int = tc.field(on_setattr=int)

    assert Tree(2.7).a == 2


def test_on_setattr_sequence_applies_in_order():
    class Tree(tc.TreeClass):
        a: Any = tc.field(on_setattr=[float, lambda v: v * 10, str])

    assert Tree(2).a == "20.0"


def test_on_setattr_applies_to_defaults_and_factories():
    class Tree(tc.TreeClass):
        a: float = tc.field(default=1, on_setattr=float)
        b: float = tc.field(factory=lambda: 2, on_setattr=float)
        c: float = tc.field(default=3, init=False, on_setattr=float)

    assert [type(v) for v in vars(Tree()).values()] == [float, float, float]


def test_on_setattr_applies_in_hand_written_init():
    class Tree(tc.TreeClass):
        a: int = tc.field(on_setattr=[int])

        def __init__(self, a):
            self.a = a
            self.b = a  # not a field: stored as given

    tree = Tree(2.5)
    assert (tree.a, tree.b) == (2, 2.5)


def _positive(value):
    if value <= 0:
        raise ValueError(f"expected a positive value, got {value}")
    return value


def test_on_setattr_validation_error_names_field_in_generated_init():
    class Tree(tc.TreeClass):
        rate: float = tc.field(on_setattr=_positive)

    with pytest.raises(ValueError, match="expected a positive value, got -1") as info:
        Tree(-1)
    assert str(info.value).startswith("while setting field `Tree.rate` (its on_setattr): ")


def test_on_setattr_validation_error_names_field_in_hand_written_init():
    class Tree(tc.TreeClass):
        rate: float = tc.field(on_setattr=_positive)

        def __init__(self, rate):
            self.rate = rate

    with pytest.raises(ValueError, match="expected a positive value") as info:
        Tree(0)
    assert str(info.value).startswith("while setting field `Tree.rate` (its on_setattr): ")


def test_on_getattr_applies_on_read_but_flatten_sees_stored_value():
    class Tree(tc.TreeClass):
        a: float = tc.field(default=1.0, on_getattr=[lambda v: v * 10, lambda v: v + 1])

    tree = Tree(2.0)
    assert tree.a == 21.0
    assert vars(tree) == {"a": 2.0}
    assert jax.tree_util.tree_leaves(tree) == [2.0]
    assert Tree.a == 1.0  # the class attribute is the default


def test_on_getattr_survives_tree_map_and_inheritance():
    class Tree(tc.TreeClass):
        a: float = tc.field(on_getattr=abs)

    class Child(Tree):
        b: float = 0.0

    mapped = jax.tree_util.tree_map(lambda v: v - 5.0, Child(1.0))
    assert mapped.a == 4.0
    assert vars(mapped)["a"] == -4.0


def test_on_getattr_dropped_when_subclass_redefines_field_without_it():
    class Parent(tc.TreeClass):
        a: float = tc.field(on_getattr=abs)

    class Child(Parent):
        a: float

    assert Parent(-1.0).a == 1.0
    assert Child(-1.0).a == -1.0


def test_on_getattr_field_without_default_has_no_class_attribute():
    class Tree(tc.TreeClass):
        a: float = tc.field(on_getattr=abs)

    assert not hasattr(Tree, "a")
    with pytest.raises(AttributeError, match="`Tree` instance has no attribute 'a'"):
        _ = Tree.__new__(Tree).a


# -- field(metadata=..., doc=...) ----------------------------------------------------------------


def test_metadata_is_a_read_only_copy():
    source = {"unit": "m"}

    class Tree(tc.TreeClass):
        a: float = tc.field(metadata=source)

    (item,) = tc.fields(Tree)
    source["unit"] = "km"
    assert item.metadata == {"unit": "m"}
    with pytest.raises(TypeError, match="does not support item assignment"):
        item.metadata["unit"] = "s"


def test_metadata_defaults_to_empty_mapping():
    assert dict(tc.field().metadata) == {}


def test_doc_is_kept_on_the_field():
    class Tree(tc.TreeClass):
        a: float = tc.field(doc="the learning rate")

    assert tc.fields(Tree)[0].doc == "the learning rate"


# -- Field and fields() --------------------------------------------------------------------------


def test_field_returns_field_with_given_arguments():
    item = tc.field(
        default=1,
        init=False,
        repr=False,
        kind="KW_ONLY",
        alias="x",
        on_setattr=int,
        on_getattr=[abs],
        static=True,
        metadata={"k": 1},
        doc="d",
    )
    assert isinstance(item, tc.Field)
    assert (item.default, item.factory, item.init, item.repr, item.kind, item.alias) == (
        1,
        None,
        False,
        False,
        "KW_ONLY",
        "x",
    )
    assert item.on_setattr == (int,) and item.on_getattr == (abs,)
    assert item.static is True and dict(item.metadata) == {"k": 1} and item.doc == "d"


def test_field_defaults():
    item = tc.field()
    assert item.default is MISSING and item.factory is None and not item.has_default
    assert (item.init, item.repr, item.kind, item.alias, item.static) == (
        True,
        True,
        "POS_OR_KW",
        None,
        False,
    )
    assert item.on_setattr == () and item.on_getattr == () and item.doc == ""


def test_field_is_immutable_and_replace_makes_a_copy():
    item = tc.field(default=1)
    with pytest.raises(AttributeError, match=r"Field objects are immutable; use `field.replace"):
        item.default = 2
    changed = item.replace(default=2)
    assert (item.default, changed.default) == (1, 2)


def test_field_equality_and_repr():
    assert tc.field(default=1, static=True) == tc.field(default=1, static=True)
    assert tc.field(default=1) != tc.field(default=2)
    assert repr(tc.field(default=1, static=True)) == (
        "Field(name=None, type=None, default=1, factory=None, init=True, repr=True, "
        "kind='POS_OR_KW', alias=None, on_setattr=(), on_getattr=(), static=True, "
        "metadata={}, doc='')"
    )


def test_field_equality_with_array_defaults_does_not_raise():
    first, second = tc.field(default=jnp.ones(3)), tc.field(default=jnp.ones(3))
    assert first == first
    assert (first == second) is False  # distinct arrays: compared as different defaults


def test_fields_in_definition_order_inherited_first():
    class Base(tc.TreeClass):
        a: int = 1
        b: int = 2

    class Middle(Base):
        c: int = 3

    class Leaf(Middle):
        b: int = 20  # a redefinition keeps the original position
        d: int = 4

    assert [f.name for f in tc.fields(Leaf)] == ["a", "b", "c", "d"]
    assert tc.fields(Leaf)[1].default == 20
    assert vars(Leaf()) == {"a": 1, "b": 20, "c": 3, "d": 4}


def test_fields_of_instance_equals_fields_of_class():
    class Tree(tc.TreeClass):
        a: int = 1

    assert tc.fields(Tree()) == tc.fields(Tree)
    assert tc.fields(Tree)[0].name == "a" and tc.fields(Tree)[0].type == "int"


def test_fields_of_plain_class_reads_annotations():
    class Plain:
        a: int = 1
        b: ClassVar[int] = 2

    assert [(f.name, f.default) for f in tc.fields(Plain)] == [("a", 1)]


def test_fields_of_class_without_fields_is_empty():
    class Tree(tc.TreeClass):
        def __init__(self):
            self.a = 1

    assert tc.fields(Tree) == ()
    assert tc.fields(tc.TreeClass) == ()


# -- bad arguments raise at definition time --------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"kind": "WRONG"}, ValueError, r"`kind` must be one of \('POS_ONLY'.*got 'WRONG'"),
        (
            {"on_setattr": 1},
            TypeError,
            r"`on_setattr` must be a callable or a sequence of callables, got 1 \(an `int`\)",
        ),
        ({"on_setattr": [int, "x"]}, TypeError, "`on_setattr` must be a callable.*got 'x'"),
        ({"on_getattr": [1]}, TypeError, "`on_getattr` must be a callable.*got 1"),
        ({"alias": 1}, TypeError, r"`alias` must be a str, got 1 \(an `int`\)"),
        ({"alias": "not valid"}, ValueError, "`alias` must be a valid identifier"),
        ({"default": 1, "factory": list}, TypeError, "either `default` or `factory`"),
        ({"factory": 1}, TypeError, r"`factory` must be callable, got 1 \(an `int`\)"),
        ({"metadata": 1}, TypeError, r"`metadata` must be a mapping, got 1 \(an `int`\)"),
        ({"doc": 1}, TypeError, r"`doc` must be a str, got 1 \(an `int`\)"),
    ],
)
def test_bad_field_arguments_raise_at_definition(kwargs, error, message):
    with pytest.raises(error, match=message):

        class Tree(tc.TreeClass):
            a: int = tc.field(**kwargs)


# -- static fields (definition side; flatten/jit behaviour is in test_treeclass.py) -----------


def test_static_field_is_listed_in_static_names():
    class Tree(tc.TreeClass):
        a: float
        name: str = tc.field(default="x", static=True)

    assert _node.static_names(Tree) == ("name",)
    assert jax.tree_util.tree_leaves(Tree(1.0)) == [1.0]


def test_unhashable_static_value_raises_naming_field():
    class Tree(tc.TreeClass):
        sizes: Any = tc.field(static=True)

    with pytest.raises(
        TypeError,
        match=r"Static field `Tree\.sizes` must be hashable, but got "
        r"a value of type list",
    ):
        Tree([1, 2])
    assert Tree((1, 2)).sizes == (1, 2)


def test_unhashable_static_in_tuple_raises_naming_field():
    class Tree(tc.TreeClass):
        sizes: Any = tc.field(static=True)

    with pytest.raises(TypeError, match=r"`Tree\.sizes` must be hashable.*type tuple"):
        Tree((1, [2]))


def test_unhashable_static_in_hand_written_init_raises_naming_field():
    class Tree(tc.TreeClass):
        config: Any = tc.field(static=True)

        def __init__(self):
            self.config = {"lr": 1}

    with pytest.raises(TypeError, match=r"Static field `Tree\.config` must be hashable.*dict"):
        Tree()


@pytest.mark.parametrize("array", [jnp.ones(2), np.ones(2)], ids=["jax", "numpy"])
def test_array_in_static_field_warns_at_the_callers_line(array):
    class Tree(tc.TreeClass):
        table: Any = tc.field(static=True)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tree = Tree(array)
    (warning,) = caught
    assert "Static field `Tree.table` holds an array" in str(warning.message)
    assert "tc.freeze" in str(warning.message)
    assert warning.filename == __file__
    assert tree.table is array


def test_array_in_static_tuple_warns():
    class Tree(tc.TreeClass):
        table: Any = tc.field(static=True)

    with pytest.warns(UserWarning, match=r"Static field `Tree\.table` holds an array"):
        Tree((1, jnp.ones(2)))


def test_layouts_holding_arrays_do_not_outlive_their_instances():
    import gc

    class Tree(tc.TreeClass):
        table: Any = tc.field(static=True)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trees = [Tree(jnp.ones(2)) for _ in range(3)]
        kept = Tree(jnp.ones(2))
    assert len(_node.live_layouts(Tree)) == 4  # one per distinct array (compared by identity)
    del kept
    gc.collect()
    assert len(_node.live_layouts(Tree)) == 3  # the class does not keep the arrays alive
    for tree in trees:
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        assert jax.tree_util.tree_unflatten(treedef, leaves).table is tree.table


# -- property: the generated __init__ stores what it is given ----------------------------------

_field_names = st.from_regex(r"[a-z][a-z0-9_]{0,5}", fullmatch=True).filter(
    lambda n: not keyword.iskeyword(n) and n not in ("at", "self")
)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(_field_names, st.sampled_from(["POS_ONLY", "POS_OR_KW", "KW_ONLY"])),
        unique_by=lambda spec: spec[0],
        max_size=6,
    ),
    st.booleans(),
)
def test_generated_init_stores_arguments_by_name(specs, with_defaults):
    def body(namespace):
        namespace["__annotations__"] = {name: "int" for name, _ in specs}
        for i, (name, kind) in enumerate(specs):
            default = -i if with_defaults else MISSING
            namespace[name] = tc.field(kind=kind, default=default)

    Tree = types.new_class("Tree", (tc.TreeClass,), exec_body=body)
    values = {name: i for i, (name, _) in enumerate(specs)}
    order = {"POS_ONLY": 0, "POS_OR_KW": 1}
    positional = sorted((s for s in specs if s[1] in order), key=lambda s: order[s[1]])
    tree = Tree(
        *(values[name] for name, _ in positional),
        **{name: values[name] for name, kind in specs if kind == "KW_ONLY"},
    )
    assert vars(tree) == values  # definition order, whatever the parameter order
    if with_defaults:
        assert vars(Tree()) == {name: -i for i, (name, _) in enumerate(specs)}
