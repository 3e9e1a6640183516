"""Tests for the selectors of `.at[...]` (treeclass/_selectors.py)."""

from __future__ import annotations

import pathlib
import re

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
    _parse_glob,
    compile_selector,
    entry_name,
    is_mask_like,
)


def where_text() -> str:
    return "tree.at[?]"


# -- glob syntax -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "segments"),
    [
        ("layers.*.weight", ("layers", "*", "weight")),
        ("layers[0].weight", ("layers", "0", "weight")),
        (".a[0]['b']", ("a", "0", "b")),
        ("**.bias", ("**", "bias")),
        ("['a.b'].c", ("a.b", "c")),
        ('a["x"]', ("a", "x")),
        ("a[*]", ("a", "*")),
    ],
)
def test_glob_parses_segments(pattern, segments):
    assert _parse_glob(pattern) == segments


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("a..b", "Empty segment in glob 'a..b'"),
        ("a.", "ends with '.'"),
        ("a]", r"Unbalanced '\]'"),
        ("a[0]b", r"Expected '\.' or '\[' after '\]'"),
        ("", "Empty glob pattern"),
        ("a[]", "Empty brackets"),
        ("a[0", r"Unclosed '\['"),
        ("a['x]", "Unclosed quote"),
    ],
)
def test_glob_rejects_malformed_patterns(pattern, message):
    with pytest.raises(ValueError, match=message):
        tc.glob(pattern)


def test_glob_needs_a_string():
    with pytest.raises(TypeError, match="pattern string"):
        tc.glob(3)


def test_glob_that_matches_nothing_is_an_error_naming_the_closest_key():
    tree = {"a": {"b": 1}}
    with pytest.raises(
        LookupError,
        match=r"(?s)glob\('a\.c'\) selects nothing.*after a, no key "
        r"matches 'c' \(keys there: 'b'\)",
    ):
        tc.at(tree)[tc.glob("a.c")].get()


def test_glob_wildcard_question_mark_and_index_names():
    tree = {"l": [10, 11, 12], "x1": 1, "x22": 2}
    assert tc.at(tree)[tc.glob("x?")].set(0) == {"l": [10, 11, 12], "x1": 0, "x22": 2}
    assert tc.at(tree)[tc.glob("l.[1]")].set(0)["l"] == [10, 0, 12]
    assert tc.at(tree)[tc.glob("l.*")].set(0)["l"] == [0, 0, 0]


def test_glob_selects_subtrees_then_relative_names():
    tree = {"blocks": [{"w": 1, "b": 2}, {"w": 3, "b": 4}]}
    new = tc.at(tree)[tc.glob("blocks.*")]["w"].set(0)
    assert new == {"blocks": [{"w": 0, "b": 2}, {"w": 0, "b": 4}]}


def test_glob_double_star_matches_zero_levels():
    tree = {"w": 1, "a": {"w": 2}}
    assert tc.at(tree)[tc.glob("**.w")].set(0) == {"w": 0, "a": {"w": 0}}


@settings(max_examples=30, deadline=None)
@given(
    st.recursive(
        st.integers(0, 9),
        lambda c: (
            st.dictionaries(st.sampled_from(["a", "b", "c.d", "e"]), c, min_size=1, max_size=3)
            | st.lists(c, min_size=1, max_size=3)
        ),
        max_leaves=6,
    ),
    st.data(),
)
def test_property_glob_of_keystr_selects_exactly_that_leaf(tree, data):
    pairs = jax.tree_util.tree_flatten_with_path(tree)[0]
    index = data.draw(st.integers(0, len(pairs) - 1))
    path = pairs[index][0]
    if not path:
        return  # a bare leaf has an empty path
    got = tc.at(tree)[tc.glob(jax.tree_util.keystr(path))].get(fill_value="-")
    flags = [leaf != "-" for leaf in jax.tree_util.tree_leaves(got)]
    assert flags == [i == index for i in range(len(pairs))]


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
