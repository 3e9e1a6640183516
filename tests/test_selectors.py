"""Tests for the selectors of `.at[...]` (treeclass/_selectors.py)."""

from __future__ import annotations

import abc
import collections
import collections.abc
import enum
import numbers
import pathlib
import re
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treeclass as tc
from treeclass._selectors import (
    EllipsisMatcher,
    GlobMatcher,
    IndexMatcher,
    MaskMatcher,
    NameMatcher,
    TypeMatcher,
    UnionMatcher,
    compile_selector,
    entry_name,
    is_mask_like,
)


def where_text() -> str:
    return "tree.at[?]"


# -- where ------------------------------------------------------------------------------


def test_where_needs_a_callable():
    with pytest.raises(TypeError, match="callable"):
        tc.where(3)


def test_where_does_not_look_into_a_match():
    tree = {"a": {"b": 1}, "c": 2}
    calls = []

    def fn(path, node):
        calls.append(jax.tree_util.keystr(path))
        return isinstance(node, dict)

    assert tc.at(tree)[tc.where(fn)].set(0) == {"a": {"b": 0}, "c": 2}
    assert "['a']['b']" not in calls


def test_where_array_result_is_element_mask():
    tree = {"a": jnp.array([-1.0, 2.0])}
    select = tc.where(lambda path, node: node > 0 if isinstance(node, jax.Array) else False)
    assert tc.at(tree)[select].set(0.0)["a"].tolist() == [-1.0, 0.0]


def test_where_repr_names_the_function():
    def is_big(path, node):
        return False

    assert repr(tc.where(is_big)) == "where(test_where_repr_names_the_function.<locals>.is_big)"


# -- BaseKey ----------------------------------------------------------------------------


def test_basekey_is_abstract():
    class Incomplete(tc.BaseKey):
        pass

    with pytest.raises(TypeError):
        Incomplete()


def test_basekey_receives_every_entry_kind():
    seen = []

    class Spy(tc.BaseKey):
        def __eq__(self, entry):
            seen.append(type(entry).__name__)
            return False

    with pytest.raises(LookupError, match="selects nothing"):  # as a name would
        tc.at({"a": [1]})[Spy()].get()
    with pytest.raises(LookupError, match="selects nothing"):
        tc.at([1])[Spy()].get()
    tc.at(jnp.ones(1))[...].get()
    assert seen == ["DictKey", "SequenceKey"]


def test_basekey_may_return_numpy_bool():
    class Any_(tc.BaseKey):
        def __eq__(self, entry):
            return np.bool_(True)

    assert tc.at({"a": 1})[Any_()].set(0) == {"a": 0}


# -- compiling --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "matcher"),
    [
        ("a", NameMatcher),
        (0, IndexMatcher),
        (np.int64(1), IndexMatcher),
        (..., EllipsisMatcher),
        (int, TypeMatcher),
        (True, MaskMatcher),
        (np.bool_(False), MaskMatcher),
        (jnp.array([True]), MaskMatcher),
        ({"a": True}, MaskMatcher),
        ((True, False), MaskMatcher),
        (("a", 0), UnionMatcher),
        (("a", True), UnionMatcher),
    ],
)
def test_compile_selector_kinds(selector, matcher):
    assert isinstance(compile_selector(selector, where_text), matcher)


def test_glob_matcher_is_shared_by_equal_patterns():
    first = compile_selector(tc.glob("a.*"), where_text)
    assert isinstance(first, GlobMatcher)
    assert compile_selector(tc.glob("a.*"), where_text) is first


@pytest.mark.parametrize(
    ("selector", "hint"),
    [
        (1.5, "Indices must be ints"),
        (["a"], "use a tuple"),
        (jnp.array([1, 2]), "must be boolean"),
        (None, ""),
        (object(), ""),
    ],
)
def test_unsupported_selectors_raise_not_implemented(selector, hint):
    with pytest.raises(NotImplementedError, match=re.escape("tree.at[?]") + ".*" + hint):
        compile_selector(selector, where_text)


def test_is_mask_like():
    assert is_mask_like(True) and is_mask_like(np.bool_(True))
    assert is_mask_like(jnp.array([True, False])) and is_mask_like({"a": [True, False]})
    assert not is_mask_like(1) and not is_mask_like(jnp.array([1])) and not is_mask_like("a")
    assert not is_mask_like({"a": 1}) and not is_mask_like(None)
    assert not is_mask_like(("a", True)) and not is_mask_like([...])


def test_entry_name_of_each_key_type():
    tu = jax.tree_util
    assert entry_name(tu.GetAttrKey("w")) == "w"
    assert entry_name(tu.DictKey(3)) == 3
    assert entry_name(tu.SequenceKey(2)) == 2
    assert entry_name(tu.FlattenedIndexKey(1)) == 1


def test_regex_matches_string_form_of_index():
    assert tc.at([1, 2, 3])[re.compile("[02]")].set(0) == [0, 2, 0]


def test_union_of_element_masks_is_their_or():
    tree = {"x": jnp.array([1.0, 2.0, 3.0])}
    first, second = jnp.array([True, False, False]), jnp.array([False, False, True])
    union = (tc.where(lambda p, x: first), tc.where(lambda p, x: second))
    assert tc.at(tree)[union].set(0.0)["x"].tolist() == [0.0, 2.0, 0.0]


def test_tuple_of_only_masks_is_one_mask_not_a_union():
    tree = (jnp.array([1.0, 2.0]), 3.0)
    mask = (jnp.array([True, False]), False)
    new = tc.at(tree)[mask].set(0.0)
    assert new[0].tolist() == [0.0, 2.0] and new[1] == 3.0


def test_selector_reprs():
    assert repr(tc.glob("a.*")) == "glob('a.*')"
    assert repr(tc.at({"a": 1})["a"][...]) == "AtIndexer(tree.at['a'][...])"


# -- documentation ----------------------------------------------------------------------


@pytest.mark.parametrize("module", ["treeclass._at", "treeclass._selectors"])
def test_docstring_examples_run(module):
    import importlib
    import textwrap

    source = pathlib.Path(importlib.import_module(module).__file__).read_text()
    blocks = re.findall(r"```python\n(.*?)```", source, re.S)
    assert blocks
    for block in blocks:
        exec(textwrap.dedent(block), {})


# -- def_alias cannot redefine built-in selectors -----------------------------------------


class _Point(tc.TreeClass):
    x: float = 1.0
    y: float = 2.0


class _AnyKey(tc.BaseKey):
    def __eq__(self, entry):
        return True


class _Metaclass(type):
    pass


@pytest.mark.parametrize(
    "kind",
    [
        dict,
        list,
        tuple,
        str,
        int,
        bool,
        type(...),
        re.Pattern,
        type,
        tc.BaseKey,
        object,
        type(None),
        jax.Array,
        np.ndarray,
        np.bool_,
        np.integer,
        type(tc.glob("a")),
        type(tc.where(lambda p, x: True)),
        slice,
        jax.tree_util.GetAttrKey,
        jax.tree_util.DictKey,
        jax.tree_util.SequenceKey,
        jax.core.Tracer,
        tc.TreeClass,
    ],
)
def test_def_alias_refuses_built_in_selector_types(kind):
    with pytest.raises(TypeError, match=r"would change what built-in selectors mean"):
        tc.BaseKey.def_alias(kind, lambda value: "a")
    # and nothing changed: the built-in meanings still hold
    tree = {"a": 1, "b": 2}
    assert tc.at(tree)[{"a": True, "b": False}].get() == {"a": 1, "b": None}
    assert tc.at(tree)["b"].set(0) == {"a": 1, "b": 0}
    assert tc.at([1, 2])[1].set(0) == [1, 0]


@pytest.mark.parametrize(
    "kind",
    [
        collections.OrderedDict,  # a dict: a mask
        collections.namedtuple("Pair", "a b"),  # a tuple: a union or a mask
        enum.IntEnum,  # an int: an index
        _Metaclass,  # a type: its instances are classes
        abc.ABCMeta,
        _Point,  # a TreeClass: a mask
        _AnyKey,  # a BaseKey: matches through `__eq__` already
        np.int64,
    ],
)
def test_def_alias_refuses_subclasses_of_built_in_selector_types(kind):
    with pytest.raises(TypeError, match=r"is a subclass of"):
        tc.BaseKey.def_alias(kind, lambda value: "a")


@pytest.mark.parametrize(
    "kind", [object, numbers.Number, collections.abc.Callable, collections.abc.Hashable, np.generic]
)
def test_def_alias_refuses_types_that_built_in_selectors_are_instances_of(kind):
    with pytest.raises(TypeError, match=r"are instances of"):
        tc.BaseKey.def_alias(kind, lambda value: "a")


def test_refused_registrations_leave_slices_and_key_entries_their_meaning():
    for kind in (slice, jax.tree_util.DictKey, jax.tree_util.SequenceKey):
        with pytest.raises(TypeError, match=r"would change what built-in selectors mean"):
            tc.BaseKey.def_alias(kind, lambda value: "b")
        with pytest.raises(TypeError, match=r"would change what built-in selectors mean"):
            tc.at.def_rule(kind, lambda value, entry, child: True)
    assert tc.at([1, 2, 3])[1:].set(0) == [1, 0, 0]
    tree = {"a": [1, 2], "b": 3}
    key = jax.tree_util.DictKey("a")
    assert tc.at(tree)[key][jax.tree_util.SequenceKey(1)].set(0) == {"a": [1, 0], "b": 3}


def test_def_alias_of_tc_treeclass_says_its_values_are_masks():
    with pytest.raises(TypeError, match=r"`tc\.TreeClass` values are boolean masks"):
        tc.BaseKey.def_alias(tc.TreeClass, lambda value: "a")


def test_def_alias_refusal_says_what_the_type_means():
    with pytest.raises(
        TypeError, match=r"`dict` values are boolean masks.*alias a type of your own"
    ):
        tc.BaseKey.def_alias(dict)(lambda value: "a")


def _alias_of(converter):
    class Token:
        def __init__(self, name):
            self.name = name

        def __repr__(self):
            return f"Token({self.name!r})"

    tc.BaseKey.def_alias(Token, converter)
    return Token


@pytest.mark.parametrize(
    ("converter", "why"),
    [
        (lambda token: token, "it is a value of an aliased type"),
        (lambda token: (token,), r"its member Token\('a'\) is a value of an aliased type"),
        (lambda token: None, "not a built-in selector"),
        (lambda token: 1.5, "not a built-in selector"),
        (lambda token: ["a"], "not a built-in selector"),
        (lambda token: {"a": 1}, r"a mask with a non-bool leaf at tree\['a'\]: 1"),
        (lambda token: ("a", ("b",)), "a union is one flat tuple"),
    ],
)
def test_def_alias_converter_must_return_a_built_in_selector(converter, why):
    Token = _alias_of(converter)
    with pytest.raises(TypeError, match=r"def_alias\(.*Token\)` returned .*" + why):
        tc.at({"a": 1, "b": 2})[Token("a")].get()


def test_def_alias_converter_result_names_the_type_that_came_back():
    Token = _alias_of(lambda token: 1.5)
    with pytest.raises(TypeError, match=r"returned 1\.5 \(a `float`\) for Token\('a'\)"):
        tc.at({"a": 1})[Token("a")].set(0)


def test_def_alias_converter_error_is_noted_with_the_alias():
    Token = _alias_of(lambda token: 1 / 0)
    with pytest.raises(ZeroDivisionError) as info:
        tc.at({"a": 1})[Token("a")].get()
    assert any("def_alias" in note for note in getattr(info.value, "__notes__", ["def_alias"]))


def test_def_alias_converter_may_return_names_keys_masks_and_unions():
    class Named(tc.BaseKey):
        def __init__(self, name):
            self.name = name

        def __eq__(self, entry):
            return getattr(entry, "key", None) == self.name

    tree = {"a": 1, "b": 2, "c": 3}
    assert tc.at(tree)[_alias_of(lambda t: t.name)("a")].set(0) == {"a": 0, "b": 2, "c": 3}
    assert tc.at(tree)[_alias_of(lambda t: Named(t.name))("b")].set(0)["b"] == 0
    union = _alias_of(lambda t: ("a", Named("c")))("x")
    assert tc.at(tree)[union].set(0) == {"a": 0, "b": 2, "c": 0}
    mask = _alias_of(lambda t: {"a": False, "b": True, "c": False})("x")
    assert tc.at(tree)[mask].set(0) == {"a": 1, "b": 0, "c": 3}


def test_def_alias_of_a_pytree_node_type_is_refused_when_used():
    class Box:
        def __init__(self, value):
            self.value = value

    tc.BaseKey.def_alias(Box, lambda box: "a")
    jax.tree_util.register_pytree_node(Box, lambda b: ((b.value,), None), lambda _, c: Box(*c))
    with pytest.raises(TypeError, match=r"is a pytree node .* a boolean mask"):
        tc.at({"a": 1})[Box(True)].get()


def test_def_alias_of_an_abstract_base_class_covers_its_virtual_subclasses():
    class Marker(abc.ABC):  # noqa: B024 (an ABC used only for registration)
        pass

    class Plain:
        pass

    Marker.register(Plain)
    tc.BaseKey.def_alias(Marker, lambda value: "b")
    assert tc.at({"a": 1, "b": 2})[Plain()].set(0) == {"a": 1, "b": 0}


# -- at.def_rule and BaseKey.def_alias: one registry of selector types -------------------------


def _first_key_rule(matcher, entry, child):
    return getattr(entry, "key", getattr(entry, "name", None)) == matcher.name


@pytest.mark.parametrize(
    "kind", [dict, list, tuple, str, int, bool, type(...), slice, re.Pattern, type, tc.BaseKey]
)
def test_def_rule_refuses_built_in_selector_types_naming_def_rule(kind):
    with pytest.raises(TypeError, match=r"`tc\.at\.def_rule\(.*would change what built-in"):
        tc.at.def_rule(kind, _first_key_rule)
    assert tc.at({"a": 1, "b": 2})["b"].set(0) == {"a": 1, "b": 0}


def test_def_rule_refuses_a_plain_namedtuple_subclass_only_through_tuple_meanings():
    class Keyed(tc.BaseKey):  # a BaseKey subclass is a selector already, NamedTuple or not
        def __eq__(self, entry):
            return False

    with pytest.raises(TypeError, match=r"subclass of `tc\.BaseKey`"):
        tc.at.def_rule(Keyed, _first_key_rule)


def test_def_rule_covers_subclasses_of_a_namedtuple_matcher():
    class Name(typing.NamedTuple):
        name: str

    class Tagged(Name):  # a subclass, as the docstring says: still the rule, not a union
        pass

    tc.at.def_rule(Name, _first_key_rule)
    tree = {"a": 1, "b": 2}
    assert tc.at(tree)[Tagged("b")].set(0) == {"a": 1, "b": 0}
    with pytest.raises(LookupError, match=r"Tagged\(name=0\) selects nothing"):
        tc.at([5, 6])[Tagged(0)].get()  # the rule (no key named 0), never index 0


def test_def_rule_namedtuple_of_bools_is_a_matcher_not_a_mask():
    class Pick(typing.NamedTuple):
        first: bool
        second: bool

    tc.at.def_rule(Pick, lambda m, entry, child: (m.first, m.second)[entry.idx])
    assert tc.at((1, 2))[Pick(False, True)].set(0) == (1, 0)
    assert tc.at([1, 2])[Pick(True, False)].set(0) == [0, 2]  # a list: a mask would not fit


def test_def_alias_converter_may_not_return_a_def_rule_value():
    class Name(typing.NamedTuple):
        name: str

    class Label:
        def __init__(self, name):
            self.name = name

    tc.at.def_rule(Name, _first_key_rule)
    tc.at.def_rule(Label, _first_key_rule)
    for rule_value in (Name("b"), Label("b")):
        token = _alias_of(lambda token, value=rule_value: value)("x")
        with pytest.raises(TypeError, match=r"registered with `tc\.at\.def_rule`.*do not chain"):
            tc.at({"a": 1, "b": 2})[token].set(0)


def test_registering_a_type_again_replaces_it_in_either_registry():
    class Token:
        def __init__(self, name):
            self.name = name

    tree = {"a": 1, "b": 2}
    tc.BaseKey.def_alias(Token, lambda token: "a")
    assert tc.at(tree)[Token("b")].set(0) == {"a": 0, "b": 2}
    tc.at.def_rule(Token, _first_key_rule)
    assert tc.at(tree)[Token("b")].set(0) == {"a": 1, "b": 0}
    tc.BaseKey.def_alias(Token, lambda token: "a")
    assert tc.at(tree)[Token("b")].set(0) == {"a": 0, "b": 2}


def test_def_rule_value_in_a_union_with_names():
    class Name(typing.NamedTuple):
        name: str

    tc.at.def_rule(Name, _first_key_rule)
    tree = {"a": 1, "b": 2, "c": 3}
    assert tc.at(tree)["a", Name("c")].set(0) == {"a": 0, "b": 2, "c": 0}


# -- a pytree selector whose leaves are not bools -------------------------------------------


@pytest.mark.parametrize(
    ("mask", "where", "leaf"),
    [
        (_Point(1, 1), r"_Point\.x", "1"),
        (_Point(True, 0), r"_Point\.y", "0"),
        (_Point("x", "y"), r"_Point\.x", "'x'"),
        (_Point(1.0, True), r"_Point\.x", r"1\.0"),
        ([1, 0], r"tree\[0\]", "1"),
        ({"x": {"deep": "no"}, "y": 0}, r"tree\['x'\]\['deep'\]", "'no'"),
    ],
)
def test_mask_with_non_bool_leaves_says_mask_and_names_the_leaf(mask, where, leaf):
    with pytest.raises(ValueError, match=r"(?s)mask.*non-bool leaf") as info:
        tc.at(_Point())[mask].get()
    assert re.search(rf"{where}\W.*{leaf}", str(info.value)), str(info.value)
    assert "Supported:" not in str(info.value)  # not the generic message


class _Pair(tc.TreeClass):
    def __init__(self):
        self.point = _Point()
        self.arrays = [jnp.ones(2), jnp.zeros(2)]


@pytest.mark.parametrize(
    ("select", "where"),
    [
        (lambda at: at[_Point(1, 1)], r"_Point\.x\W.*1"),
        (lambda at: at["point"][_Point(1, 0)], r"_Point\.x\W.*1"),
        (lambda at: tc.at(at.tree, where=["point", _Point(True, 0)]), r"point\.y\W.*0"),
        (lambda at: at["arrays"][[jnp.array([1, 0]), True]], r"_Pair\.arrays\[0\]\W.*i32\[2\]"),
        (lambda at: at["arrays"][[jnp.array([1.0, 0.0]), True]], r"_Pair\.arrays\[0\]\W.*f32\[2\]"),
        (lambda at: at["arrays"][[True, np.array([0, 1])]], r"_Pair\.arrays\[1\]\W.*array"),
    ],
)
@pytest.mark.parametrize(
    "operation",
    [
        lambda at: at.get(),
        lambda at: at.set(0.0),
        lambda at: at.apply(lambda x: x),
        lambda at: at.reduce(lambda a, b: a, initializer=0),
        lambda at: at.pluck(),
        lambda at: at.scan(lambda x, s: (x, s), 0),
    ],
)
def test_mask_with_a_non_bool_leaf_is_named_for_every_operation_and_entry_point(
    select, where, operation
):
    tree = _Pair()
    with pytest.raises(ValueError, match=r"(?s)mask.*non-bool leaf") as info:
        operation(select(tree.at))
    assert re.search(where, str(info.value)), str(info.value)
    assert "Unsupported selector" not in str(info.value) or "is a boolean mask" in str(info.value)


def test_mask_with_a_non_bool_leaf_in_a_union_is_named():
    with pytest.raises(ValueError, match=r"(?s)mask.*non-bool leaf at tree\['a'\]: 1\b"):
        tc.at({"a": 1, "b": 2})["b", {"a": 1, "b": 0}].get()


def test_pytree_selector_without_bools_is_still_not_implemented_as_pytreeclass_says():
    with pytest.raises(NotImplementedError, match=r"non-bool leaf at _Point\.x: 1\b"):
        tc.at(_Point())[_Point(1, 1)]


# -- errors that name the real cause ----------------------------------------------------------


def _positive(tree):
    return jax.tree_util.tree_map(lambda x: x > 0, tree)


def test_traced_element_mask_in_reduce_names_reduce_and_a_fix_for_it():
    tree = {"a": jnp.array([-1.0, 2.0, 3.0]), "b": jnp.array([4.0])}

    @jax.jit
    def total(tree):
        return tc.at(tree)[_positive(tree)].reduce(lambda acc, x: acc + x.sum(), initializer=0.0)

    with pytest.raises(TypeError) as info:
        total(tree)
    message = str(info.value)
    assert "`.reduce`" in message and "tree['a']" in message
    assert ".get(fill_value=0)" not in message.replace("[mask].get(fill_value=0)", "")
    assert ".reduce(fn, initializer=init)" in message.split("after:")[1]

    @jax.jit
    def fixed(tree):  # the fix the message gives
        filled = tc.at(tree)[_positive(tree)].get(fill_value=0)
        return tc.at(filled)[...].reduce(lambda acc, x: acc + x.sum(), initializer=0.0)

    assert float(fixed(tree)) == 9.0


def test_traced_element_mask_in_pluck_names_pluck_and_a_fix_for_it():
    tree = {"a": jnp.array([-1.0, 2.0, 3.0]), "b": jnp.array([4.0])}
    with pytest.raises(TypeError) as info:
        jax.jit(lambda t: tc.at(t)[_positive(t)].pluck())(tree)
    message = str(info.value)
    assert "`.pluck`" in message and "tree['a']" in message
    fix = message.split("after:")[1].strip()
    assert fix == "jax.tree_util.tree_leaves(tree.at[mask].get(fill_value=0))"

    @jax.jit
    def fixed(tree):  # the fix the message gives
        return jax.tree_util.tree_leaves(tc.at(tree)[_positive(tree)].get(fill_value=0))

    assert [x.tolist() for x in fixed(tree)] == [[0.0, 2.0, 3.0], [4.0]]


@pytest.mark.parametrize(
    ("operation", "named"),
    [
        (lambda at: at.get(), "Cannot take `leaf[mask]`"),
        (lambda at: at.pluck(), "`.pluck` cannot"),
        (lambda at: at.reduce(lambda a, x: a + x.sum(), initializer=0.0), "`.reduce` cannot"),
    ],
)
def test_traced_element_mask_from_a_predicate_names_the_operation(operation, named):
    positive = tc.where(lambda path, x: x > 0)  # a traced boolean array: an element mask
    with pytest.raises(TypeError, match=re.escape(named)):
        jax.jit(lambda t: operation(tc.at(t)[positive]))({"a": jnp.array([-1.0, 2.0])})


def test_traced_element_mask_in_get_still_suggests_a_fill_value():
    with pytest.raises(TypeError, match=r"get\(fill_value=0\)"):
        jax.jit(lambda t: tc.at(t)[_positive(t)].get())({"a": jnp.array([1.0, -1.0])})


@pytest.mark.parametrize(
    "frozen", [tc.freeze("relu"), tc.freeze(jnp.ones(2)), tc.freeze(None), tc.freeze({"w": 1})]
)
@pytest.mark.parametrize("pattern", ["*.weight", "**.weight", "*.*.weight", "[*].weight"])
def test_glob_matching_nothing_beside_an_unrelated_frozen_value_says_no_key_matches(
    frozen, pattern
):
    tree = {"a": {"w": 1.0}, "f": frozen}
    with pytest.raises(LookupError, match=r"no key (matches|to match) 'weight'") as info:
        tc.at(tree)[tc.glob(pattern)].set(0.0)
    assert "(frozen)" not in str(info.value) and "is_leaf" not in str(info.value)


def test_glob_matching_nothing_beside_frozen_treeclass_fields_says_no_key_matches():
    tree = [_Point(1.0, tc.freeze("relu")), _Point(2.0, tc.freeze("gelu"))]
    with pytest.raises(
        LookupError, match=r"after \*, no key matches 'bias' \(keys there: 'x', 'y'"
    ):
        tc.at(tree)[tc.glob("*.bias")].apply(lambda x: x)


def test_glob_that_goes_on_inside_a_frozen_value_says_unfreeze_first():
    tree = {"a": {"w": 1.0}, "f": tc.freeze({"weight": 1.0})}
    with pytest.raises(LookupError, match=r"(?s)goes on inside tree\['f'\] \(frozen\).*unfreeze"):
        tc.at(tree)[tc.glob("*.weight")].set(0.0)
    # `is_leaf=tc.is_frozen` cannot reach inside either, and the error says so
    with pytest.raises(LookupError, match=r"tree\['f'\] has no key to match 'weight'.*frozen"):
        tc.at(tree)[tc.glob("f.weight")].set(0.0, is_leaf=tc.is_frozen)
    assert tc.unfreeze(tc.at(tree)[tc.glob("f")].get(is_leaf=tc.is_frozen)["f"]) == {"weight": 1.0}


def test_name_that_matches_nothing_beside_a_selected_frozen_value_is_said_first():
    tree = {"f": tc.freeze(1.0), "a": 1.0}
    for typo in (tc.glob("wieght"), re.compile("wieght")):
        with pytest.raises(LookupError, match=r"selects nothing.*no key matches"):
            tc.at(tree)["f", typo].set(0.0)
    with pytest.raises(LookupError, match=r"reaches no leaves.*tree\['f'\] \(frozen\)"):
        tc.at(tree)["f"].set(0.0)  # the frozen value itself is the cause here


class _NeverKey(tc.BaseKey):
    def __eq__(self, entry):
        return False


class _KeyIs(typing.NamedTuple):
    key: str


tc.at.def_rule(_KeyIs, lambda matcher, entry, child: getattr(entry, "key", None) == matcher.key)


@pytest.mark.parametrize(
    "selector", [_NeverKey(), _KeyIs("wieght"), re.compile("wieght"), tc.glob("*.wieght")]
)
@pytest.mark.parametrize(
    "operation",
    [
        lambda at: at.set(0.0),
        lambda at: at.get(),
        lambda at: at.apply(lambda x: x, is_leaf=tc.is_frozen),
        lambda at: at.pluck(),
    ],
)
def test_naming_selector_that_matches_nothing_beside_frozen_values_says_no_key_matches(
    selector, operation
):
    for tree in ({"a": {"w": 1.0}, "f": tc.freeze("relu")}, [_Point(1.0, tc.freeze("relu"))]):
        with pytest.raises(LookupError, match=r"selects nothing.*no key matches") as info:
            operation(tc.at(tree)[selector])
        assert "(frozen)" not in str(info.value), str(info.value)


@pytest.mark.parametrize(
    "operation",
    [
        lambda t: tc.at(t)["a"].get(is_parallel=True),
        lambda t: tc.at(t)[...].get(is_parallel={"max_workers": 2}),
        lambda t: tc.at(t)["a"].set(1.0, is_parallel=True),
        lambda t: tc.at(t)[_positive(t)].set(1.0, is_parallel=True),
        lambda t: tc.at(t)["a"].apply(jnp.sin, is_parallel=True),
    ],
)
def test_is_parallel_on_traced_leaves_raises_for_get_set_and_apply_alike(operation):
    tree = {"a": jnp.ones(2), "b": jnp.zeros(2)}
    with pytest.raises(ValueError, match=r"`is_parallel` cannot be used on traced values.*'a'"):
        jax.jit(operation)(tree)
    operation(tree)  # outside jit it runs


def _under_jit(fn, tree):
    return jax.jit(fn)(tree)


def _under_vmap(fn, tree):
    return jax.vmap(fn)(tree)


def _under_grad(fn, tree):
    return jax.grad(lambda t: jnp.sum(jax.tree_util.tree_leaves(fn(t))[0]))(tree)


@pytest.mark.parametrize("transform", [_under_jit, _under_vmap, _under_grad])
@pytest.mark.parametrize(
    "operation",
    [
        lambda t, parallel: tc.at(t)["a"].get(is_parallel=parallel),
        lambda t, parallel: tc.at(t)[_positive(t)].get(fill_value=0.0, is_parallel=parallel),
        lambda t, parallel: tc.at(t)["a"].set(1.0, is_parallel=parallel),
        lambda t, parallel: tc.at(t)["a"].apply(jnp.sin, is_parallel=parallel),
        lambda t, parallel: tc.at(t)["a"].apply(lambda x: x, whole=True, is_parallel=parallel),
        lambda t, parallel: tc.at(t)["a"].pluck(is_parallel=parallel),
    ],
    ids=["get", "get-mask", "set", "apply", "apply-whole", "pluck"],
)
def test_is_parallel_refuses_traced_leaves_under_every_transformation(transform, operation):
    tree = {"a": jnp.ones(2), "b": jnp.zeros(2)}
    with pytest.raises(ValueError, match=r"`is_parallel` cannot be used on traced values.*'a'"):
        transform(lambda t: operation(t, True), tree)
    transform(lambda t: operation(t, False), tree)  # without it, the transformation runs
    # and outside a transformation it gives what it gives without it
    parallel = jax.tree_util.tree_leaves(operation(tree, {"max_workers": 2}))
    serial = jax.tree_util.tree_leaves(operation(tree, False))
    assert [np.asarray(x).tolist() for x in parallel] == [np.asarray(x).tolist() for x in serial]


def test_is_parallel_set_of_a_traced_value_raises():
    tree = {"a": jnp.ones(2)}
    with pytest.raises(ValueError, match=r"value set at tree\['a'\] is \(or holds\) a tracer"):
        jax.jit(lambda v: tc.at(tree)["a"].set(v, is_parallel=True))(1.0)


@given(st.lists(st.integers(-3, 3), min_size=1, max_size=6))
@settings(max_examples=30, deadline=None)
def test_is_parallel_get_and_set_give_what_they_give_without_it(values):
    tree = {str(i): v for i, v in enumerate(values)}
    mask = jax.tree_util.tree_map(lambda v: v > 0, tree)
    assert tc.at(tree)[mask].get(is_parallel=True) == tc.at(tree)[mask].get()
    assert tc.at(tree)[mask].set(9, is_parallel=True) == tc.at(tree)[mask].set(9)
