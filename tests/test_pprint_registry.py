"""The printer registry: one rule per type, found along the MRO, looked up before the node view."""

from __future__ import annotations

import dataclasses

import jax
import pytest
from jax.tree_util import GetAttrKey, SequenceKey

import treeclass as tc
from treeclass import _pprint_registry, _structure
from treeclass._pprint_registry import children_of, register_printer, rule_for, view_of


class Base:
    def __init__(self, items=()):
        self.items = list(items)


class Child(Base):
    pass


@dataclasses.dataclass
class Box:
    content: object


@pytest.fixture(autouse=True)
def forget_rules():
    yield
    for cls in (Base, Child, Box):
        register_printer(cls)


def test_no_rule_for_an_unregistered_type():
    assert rule_for(Base()) is None


def test_a_rule_is_found_along_the_mro():
    register_printer(Base, repr=lambda b: "B")
    assert rule_for(Child()).repr(Child()) == "B"
    assert tc.tree_repr([Child()]) == "[B]"


def test_a_subclass_rule_comes_before_its_base_rule():
    register_printer(Base, repr=lambda b: "B")
    register_printer(Child, repr=lambda c: "C")
    assert tc.tree_repr([Base(), Child()]) == "[B, C]"


def test_registering_again_replaces_the_rule_and_no_arguments_remove_it():
    register_printer(Base, repr=lambda b: "one")
    register_printer(Base, count=lambda b: 2)
    assert rule_for(Base()).repr is None and rule_for(Base()).count(Base()) == 2
    register_printer(Base)
    assert rule_for(Base()) is None


def test_str_defaults_to_the_repr_rule():
    register_printer(Base, repr=lambda b: "R")
    assert tc.tree_str([Base()]) == "[R]"
    register_printer(Base, repr=lambda b: "R", str=lambda b: "S")
    assert tc.tree_str([Base()]) == "[S]" and tc.tree_repr([Base()]) == "[R]"


def test_a_rule_with_children_is_a_row_of_the_node_view():
    register_printer(
        Base,
        type_name=lambda b: f"Base[{len(b.items)}]",
        children=lambda b: [(SequenceKey(i), x) for i, x in enumerate(b.items)],
    )
    row = view_of(Base([1, 2]))
    assert row is not None and row.type_name(Base([1, 2])) == "Base[2]"
    assert row.items(Base([1, 2]), False) == [("", "[0]", 1), ("", "[1]", 2)]
    assert tc.tree_repr(Base([1, 2])) == "Base[2](1, 2)"
    assert tc.tree_diagram(Base([1])) == "Base[1]\n└── [0]=1"


def test_a_rule_with_a_text_makes_a_leaf_even_with_children():
    register_printer(Base, repr=lambda b: "T", children=lambda b: [(GetAttrKey("items"), b.items)])
    assert view_of(Base()) is None
    assert tc.tree_repr(Base()) == "T"


def test_a_rule_is_consulted_before_the_table_of_node_types():
    assert view_of(Box(1)) is _structure.node_type(Box(1), _structure.node_kind(Box(1)))
    register_printer(Box, children=lambda b: [(GetAttrKey("inside"), b.content)])
    assert tc.tree_repr(Box(1)) == "Box(inside=1)"
    register_printer(Box, repr=lambda b: "<box>")
    assert tc.tree_repr({"b": Box(1)}) == "{'b': <box>}"


def test_a_rule_for_a_treeclass_replaces_its_fields_in_every_text_printer():
    class Layer(tc.TreeClass):
        w: object = 1.0

    register_printer(Layer, repr=lambda layer: "Layer!")
    try:
        assert tc.tree_repr([Layer()]) == "[Layer!]"
        assert tc.tree_diagram([Layer()]) == "list\n└── [0]=Layer!"
    finally:
        register_printer(Layer)
    assert tc.tree_repr([Layer()]) == "[Layer(w=1.0)]"


def test_is_leaf_comes_before_any_rule():
    register_printer(Base, children=lambda b: [(SequenceKey(0), 1)])
    assert view_of(Base(), is_leaf=lambda x: isinstance(x, Base)) is None


def test_children_of_gives_the_rule_children_else_the_jax_ones():
    register_printer(Base, children=lambda b: [(GetAttrKey("items"), b.items)])
    assert children_of(Base([3])) == [(GetAttrKey("items"), [3])]
    assert children_of({"b": 1, "a": 2}) == [
        (jax.tree_util.DictKey("a"), 2),
        (jax.tree_util.DictKey("b"), 1),
    ]
    assert children_of(3) is None


def test_alias_sets_one_field_and_keeps_the_others():
    register_printer(Base, repr=lambda b: "kept")
    tc.tree_summary.def_count(Base, lambda b: 5)
    rule = rule_for(Base())
    assert rule.repr(Base()) == "kept" and rule.count(Base()) == 5
    tc.tree_summary.def_count(Base, None)
    assert rule_for(Base()).count is None and rule_for(Base()).repr(Base()) == "kept"


def test_alias_works_as_a_decorator_and_returns_the_function():
    def name(b):
        return "base"

    assert tc.tree_summary.def_type(Base)(name) is name
    assert "│ base │" in tc.tree_summary([Base()])


def test_printer_alias_makes_a_named_documented_setter():
    define = _pprint_registry.printer_alias("size")
    assert define.__name__ == "def_size" and "register_printer" in define.__doc__
    define(Base, lambda b: 2048)
    assert "│ 2.00KiB │" in tc.tree_summary([Base()])


def test_a_class_is_required():
    with pytest.raises(TypeError, match="`register_printer` expects a class"):
        register_printer(Base(), repr=str)
    with pytest.raises(TypeError, match="`tree_summary.def_type` expects a class"):
        tc.tree_summary.def_type(Base(), str)


def test_rule_fields_must_be_callable_and_nothing_is_registered_then():
    with pytest.raises(TypeError, match=r"register_printer\(\.\.\., children=\.\.\.\)"):
        register_printer(Base, repr=str, children=[1])
    assert rule_for(Base()) is None


@pytest.mark.parametrize(
    ("field", "result", "error", "expected"),
    [
        ("repr", 3, TypeError, "a `str`"),
        ("count", -1, ValueError, "a non-negative `int`"),
        ("count", 1.5, TypeError, "a non-negative `int`"),
        ("children", 7, TypeError, "an iterable of `(key, child)` pairs"),
        ("children", [1], TypeError, "is not a `(key, child)` pair"),
        ("nodestyle", {"1x": "a"}, ValueError, "not a graphviz attribute name"),
    ],
)
def test_a_wrong_result_names_the_rule_and_what_was_expected(field, result, error, expected):
    register_printer(Base, **{field: lambda b: result})
    printer = tc.tree_graph if field == "nodestyle" else tc.tree_summary
    printer = tc.tree_repr if field in ("repr", "children") else printer
    with pytest.raises(error, match=r"printer rule for `Base`") as info:
        printer([Base()])
    assert expected in str(info.value)


def test_a_rule_is_the_display_part_of_the_type_row():
    register_printer(Base, count=lambda b: 3)
    row = _structure.registered_kind(Base)
    assert row is not None and row.display is rule_for(Base())
    register_printer(Base)
    assert _structure.registered_kind(Base) is None


def test_a_rule_for_a_kind_with_its_own_display_keeps_its_other_fields():
    stack = tc.Stacked.from_blocks([{"w": jax.numpy.ones(2)}] * 3)
    before = tc.tree_repr(stack)
    register_printer(tc.Stacked, count=lambda s: 7)
    try:
        assert tc.tree_repr(stack) == before and rule_for(stack).count(stack) == 7
    finally:
        register_printer(tc.Stacked)
    assert rule_for(stack).count is None and tc.tree_repr(stack) == before


def test_a_rule_without_children_keeps_how_a_dataclass_is_shown():
    register_printer(Box, count=lambda b: 4)
    assert tc.tree_repr(Box(1)) == "Box(content=1)"
    assert "│     4 │" in tc.tree_summary([Box(1)])
