"""Tests of printing: tree_repr/tree_str, diagram, summary, graph, mermaid, notebook display,
the printer registry and tree_repr_with_trace."""

from __future__ import annotations

import ast
import collections
import dataclasses
import functools
import math
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multidevice import run_check_script

import treeclass as tc
from treeclass import _pprint, _pprint_registry
from treeclass._pprint_html import tree_html, treescope_repr
from treeclass._pprint_registry import register_printer
from treeclass._structure import describe
from treeclass._values import size_text

# -- fixtures ----------------------------------------------------------------------------


class Tree(tc.TreeClass):
    a: int = 1
    b: tuple = (2.0, 3.0)
    c: jax.Array = jnp.array([4.0, 5.0, 6.0])


class Linear(tc.TreeClass):
    weight: jax.Array
    bias: jax.Array
    name: str = tc.field(default="linear", static=True)
    cache: int = tc.field(default=0, repr=False)


class Model(tc.TreeClass):
    def __init__(self):
        self.layers = [
            Linear(jnp.arange(6.0).reshape(2, 3), jnp.zeros(3)),
            Linear(jnp.ones((3, 1)), jnp.ones(1)),
        ]
        self.act = jax.nn.relu
        self.scale = tc.freeze(2.0)
        self.meta = {"steps": 10, "lr": 1e-3}


Point = collections.namedtuple("Point", ["x", "y"])


@dataclasses.dataclass
class Config:
    lr: float
    table: jax.Array
    secret: str = dataclasses.field(default="hidden", repr=False)


class Pair:
    """A foreign pytree registered with keys."""

    def __init__(self, left, right):
        self.left, self.right = left, right


jax.tree_util.register_pytree_with_keys(
    Pair,
    lambda p: (
        ((jax.tree_util.GetAttrKey("left"), p.left), (jax.tree_util.GetAttrKey("right"), p.right)),
        None,
    ),
    lambda _, children: Pair(*children),
)

# -- tree_repr / tree_str ----------------------------------------------------------------


def test_repr_fits_on_one_line():
    assert repr(Tree()) == "Tree(a=1, b=(2.0, 3.0), c=f32[3](μ=5.00, σ=0.82, ∈[4.00,6.00]))"


def test_str_prints_array_values_with_numpy():
    tree = Tree().at[...].apply(lambda x: x + 100)
    assert str(tree) == "Tree(a=101, b=(102.0, 103.0), c=[104. 105. 106.])"


def test_repr_breaks_one_child_per_line_when_too_wide():
    assert repr(Model()) == textwrap.dedent("""\
        Model(
          layers=[
            Linear(
              weight=f32[2,3](μ=2.50, σ=1.71, ∈[0.00,5.00]),
              bias=f32[3](μ=0.00, σ=0.00, ∈[0.00,0.00]),
              name='linear'
            ),
            Linear(
              weight=f32[3,1](μ=1.00, σ=0.00, ∈[1.00,1.00]),
              bias=f32[1](μ=1.00, σ=0.00, ∈[1.00,1.00]),
              name='linear'
            )
          ],
          act=relu(x),
          scale=#2.0,
          meta={'steps': 10, 'lr': 0.001}
        )""")


def test_repr_keeps_children_that_fit_on_one_line():
    assert tc.tree_repr(Model(), width=120) == textwrap.dedent("""\
        Model(
          layers=[
            Linear(weight=f32[2,3](μ=2.50, σ=1.71, ∈[0.00,5.00]), bias=f32[3](μ=0.00, σ=0.00, ∈[0.00,0.00]), name='linear'),
            Linear(weight=f32[3,1](μ=1.00, σ=0.00, ∈[1.00,1.00]), bias=f32[1](μ=1.00, σ=0.00, ∈[1.00,1.00]), name='linear')
          ],
          act=relu(x),
          scale=#2.0,
          meta={'steps': 10, 'lr': 0.001}
        )""")  # noqa: E501


def test_repr_width_counts_the_trailing_comma():
    tree = {"a": [1, 2], "b": 3}
    assert tc.tree_repr(tree, width=len("{'a': [1, 2], 'b': 3}")) == "{'a': [1, 2], 'b': 3}"
    # "  'a': [1, 2]," is 14 characters: at width 13 the list itself breaks
    assert tc.tree_repr(tree, width=13) == "{\n  'a': [\n    1,\n    2\n  ],\n  'b': 3\n}"
    assert tc.tree_repr(tree, width=14) == "{\n  'a': [1, 2],\n  'b': 3\n}"


def test_repr_tabwidth_sets_the_indentation():
    assert tc.tree_repr([1, 2], width=3, tabwidth=4) == "[\n    1,\n    2\n]"
    assert tc.tree_repr([1, 2], width=3, tabwidth=0) == "[\n1,\n2\n]"


def test_str_aligns_multiline_arrays_under_their_first_character():
    tree = {"w": jnp.arange(4.0).reshape(2, 2), "b": 1}
    assert tc.tree_str(tree) == "{\n  'w': [[0. 1.]\n        [2. 3.]],\n  'b': 1\n}"


def test_repr_hides_repr_false_fields_and_shows_static_ones_in_attribute_order():
    layer = Linear(jnp.ones(2), jnp.zeros(2), name="first", cache=7)
    text = tc.tree_repr(layer, width=200)
    assert text == (
        "Linear(weight=f32[2](μ=1.00, σ=0.00, ∈[1.00,1.00]), "
        "bias=f32[2](μ=0.00, σ=0.00, ∈[0.00,0.00]), name='first')"
    )
    assert "cache" not in str(layer)


def test_repr_of_builtin_containers_matches_python():
    tree = {"a": [1, (2,), ()], "b": {"c": None, 1: "s"}, "d": [], "e": {}}
    assert tc.tree_repr(tree) == repr(tree)


def test_one_element_tuple_keeps_its_comma_when_broken():
    assert tc.tree_repr((1,), width=2) == "(\n  1,\n)"


def test_namedtuple_dataclass_ordereddict_and_foreign_pytree_print_readably():
    tree = [
        Point(1, jnp.arange(3)),
        Config(0.1, jnp.ones(2, jnp.int8)),
        collections.OrderedDict(z=1),
        Pair(1.0, "x"),
    ]
    assert tc.tree_repr(tree, width=200) == (
        "[Point(x=1, y=i32[3](μ=1.00, σ=0.82, ∈[0,2])), "
        "Config(lr=0.1, table=i8[2](μ=1.00, σ=0.00, ∈[1,1])), "
        "OrderedDict({'z': 1}), Pair(left=1.0, right='x')]"
    )
    assert tc.tree_str(tree, width=200) == (  # `str` shows strings unquoted
        "[Point(x=1, y=[0 1 2]), Config(lr=0.1, table=[1 1]), OrderedDict({'z': 1}), "
        "Pair(left=1.0, right=x)]"
    )


@pytest.mark.parametrize(
    "value, expected",
    [
        (jnp.array([4.0, 5.0, 6.0]), "f32[3](μ=5.00, σ=0.82, ∈[4.00,6.00])"),
        (jnp.array([2, 3], jnp.int32), "i32[2](μ=2.50, σ=0.50, ∈[2,3])"),
        (jnp.array([3, 5], jnp.uint8), "u8[2](μ=4.00, σ=1.00, ∈[3,5])"),
        (jnp.array([True, False]), "bool[2]"),
        (jnp.array([1 + 2j, 3 - 1j]), "c64[2](μ=2.00+0.50j, σ=1.80)"),
        (jnp.array([-1j, -3j]), "c64[2](μ=0.00-2.00j, σ=1.00)"),
        (jnp.zeros((0, 3)), "f32[0,3]"),
        (jnp.float32(3.5), "f32[](3.5)"),
        (jnp.array(7), "i32[](7)"),
        (jnp.array(True), "bool[](True)"),
        (jnp.array([1.0, jnp.inf]), "f32[2](μ=inf, σ=nan, ∈[1.00,inf])"),
        (jnp.array([jnp.nan, 1.0]), "f32[2](μ=nan, σ=nan, ∈[nan,nan])"),
        (jnp.array([0.0, 2e6]), "f32[2](μ=1.00e+06, σ=1.00e+06, ∈[0.00,2.00e+06])"),
        (jnp.array([1.0, 3.0], jnp.bfloat16), "bf16[2](μ=2.00, σ=1.00, ∈[1.00,3.00])"),
        (jnp.ones((2, 2), jnp.float16), "f16[2,2](μ=1.00, σ=0.00, ∈[1.00,1.00])"),
        (np.array([1.0, 3.0]), "f64[2](μ=2.00, σ=1.00, ∈[1.00,3.00])"),
        (np.float32(0.1), "f32[](0.1)"),
        (jnp.float32(0.1), "f32[](0.1)"),
        (jax.random.key(0), "key<fry>[]"),
        (jax.ShapeDtypeStruct((2, 3), jnp.float32), "f32[2,3]"),
    ],
)
def test_array_repr_shows_dtype_shape_and_statistics(value, expected):
    assert tc.tree_repr(value) == expected


def test_arrays_without_statistics_print_their_type_in_repr_and_values_in_str():
    tree = [
        np.array(["a", "b"]),
        np.array([None, 1], dtype=object),
        jax.random.split(jax.random.key(0)),
    ]
    assert tc.tree_repr(tree) == "[<U1[2], object[2], key<fry>[2]]"
    assert tc.tree_str(tree) == "[['a' 'b'], [None 1], key<fry>[2]]"


def test_array_str_of_special_arrays():
    assert tc.tree_str([jnp.zeros((0,)), jnp.array([1.0, jnp.inf]), jax.random.key(0)]) == (
        "[[], [ 1. inf], key<fry>[]]"
    )


def test_functions_print_as_their_signature():
    def func(x, y=1, *args, z: int = 2, **kwargs) -> int:
        return x

    tree = [func, lambda a: a, jax.jit(func), functools.partial(func, 1), len, jnp.tanh]
    assert tc.tree_repr(tree, width=200) == (
        "[func(x, y=1, *args, z=2, **kwargs), lambda(a), func(x, y=1, *args, z=2, **kwargs), "
        "partial(func(x, y=1, *args, z=2, **kwargs), 1), len(obj, /), tanh(x, /)]"
    )


def test_partials_show_their_function_and_arguments():
    tree = {"p": tc.Partial(max, 1, ..., key=abs), "j": jax.tree_util.Partial(min, jnp.ones(2))}
    assert tc.tree_repr(tree, width=200) == (
        "{'p': Partial(max(...), 1, ..., key=abs(x, /)), "
        "'j': Partial(min(...), f32[2](μ=1.00, σ=0.00, ∈[1.00,1.00]))}"
    )
    assert tc.tree_diagram(tree["p"]) == textwrap.dedent("""\
        Partial
        ├── .func=max(...)
        ├── .args[0]=1
        ├── .args[1]=...
        └── .keywords['key']=abs(x, /)""")


def test_frozen_values_print_with_hash():
    tree = {"a": tc.freeze(1.0), "b": tc.freeze(jnp.ones(2)), "c": tc.freeze((1, [2]))}
    assert tc.tree_repr(tree) == (
        "{'a': #1.0, 'b': #f32[2](μ=1.00, σ=0.00, ∈[1.00,1.00]), 'c': #(1, [2])}"
    )
    assert tc.tree_str(tree) == "{'a': #1.0, 'b': #[1. 1.], 'c': #(1, [2])}"


def test_frozen_subtree_breaks_like_the_subtree():
    assert tc.tree_repr({"c": tc.freeze([1, 2])}, width=8) == "{\n  'c': #[\n    1,\n    2\n  ]\n}"


def test_depth_cuts_nodes_to_ellipsis_forms():
    tree = {"t": Tree(), "l": [1], "p": Point(1, 2), "d": {"x": 1}, "u": (1,), "e": [], "n": 5}
    assert tc.tree_repr(tree, depth=1, width=200) == (
        "{'t': Tree(...), 'l': [...], 'p': Point(...), 'd': {...}, 'u': (...), 'e': [], 'n': 5}"
    )
    assert tc.tree_repr(tree, depth=0) == "{...}"
    assert tc.tree_str(Model(), depth=1) == (
        "Model(layers=[...], act=relu(x), scale=#2.0, meta={...})"
    )


# every printer that takes a tree and the common options (depth, ...)
PRINTERS = [
    tc.tree_repr,
    tc.tree_str,
    tc.tree_diagram,
    tc.tree_summary,
    tc.tree_graph,
    tc.tree_mermaid,
    tree_html,
]


@pytest.mark.parametrize("depth", ["2", None, True, [1]])
@pytest.mark.parametrize("printer", PRINTERS)
def test_depth_that_is_not_a_number_raises_type_error(printer, depth):
    with pytest.raises(TypeError, match=r"`depth` must be a number .*got "):
        printer({"a": 1}, depth=depth)


def test_negative_depth_raises_value_error():
    with pytest.raises(ValueError, match=r"`depth` must be >= 0, got -1"):
        tc.tree_repr({"a": 1}, depth=-1)


def test_depth_accepts_numpy_integers_and_infinity():
    assert tc.tree_repr([[1]], depth=np.int64(1)) == "[[...]]"
    assert tc.tree_repr([[1]], depth=math.inf) == "[[1]]"


def test_bad_width_tabwidth_and_is_leaf_raise():
    with pytest.raises(TypeError, match=r"`width` must be an int, got '80'"):
        tc.tree_repr(1, width="80")
    with pytest.raises(ValueError, match=r"`tabwidth` must be >= 0, got -2"):
        tc.tree_repr(1, tabwidth=-2)
    with pytest.raises(ValueError, match=r"`tabwidth` must be >= 1, got 0"):
        tc.tree_diagram(1, tabwidth=0)
    with pytest.raises(TypeError, match=r"`is_leaf` must be a callable or None, got 3"):
        tc.tree_summary(1, is_leaf=3)


def test_objects_whose_repr_fails_still_print():
    class Broken:
        def __repr__(self):
            raise RuntimeError("boom")

    assert tc.tree_repr([Broken()]) == "[<Broken object (repr failed: RuntimeError)>]"


def test_deleted_array_prints_its_type():
    x = jnp.ones(3)
    x.delete()
    assert tc.tree_repr([x]) == "[f32[3]]"
    assert tc.tree_str([x]) == "[f32[3]]"


# -- under transformations -------------------------------------------------------------------


def _printed_inside(transform, fn, *args):
    seen = {}

    def inner(*a):
        seen["out"] = fn(*a)
        return jax.tree_util.tree_leaves(a)[0].sum()

    transform(inner)(*args)
    return seen["out"]


def test_repr_and_str_inside_jit_show_dtype_and_shape():
    text = _printed_inside(jax.jit, lambda t: (repr(t), str(t)), Tree())
    expected = "Tree(a=i32[], b=(f32[], f32[]), c=f32[3])"
    assert text == (expected, expected)


def test_repr_inside_grad_and_vmap_shows_dtype_and_shape():
    assert _printed_inside(jax.grad, tc.tree_repr, {"w": jnp.ones((2, 3))}) == "{'w': f32[2,3]}"
    assert _printed_inside(jax.vmap, tc.tree_repr, {"w": jnp.ones((4, 3))}) == "{'w': f32[3]}"


def test_diagram_and_summary_inside_jit():
    diagram, summary = _printed_inside(
        jax.jit, lambda t: (tc.tree_diagram(t), tc.tree_summary(t)), {"w": jnp.ones((2, 3))}
    )
    assert diagram == "dict\n└── ['w']=f32[2,3]"
    assert "│ ['w'] │ f32[2,3] │     6 │  24B │" in summary


# -- tree_diagram ------------------------------------------------------------------------


def test_diagram_of_a_nested_tree_with_an_array():
    tree = Tree(100.0, (10.0, 3.0), jnp.array([4.0, 5.0, 100.0]))
    assert tc.tree_diagram(tree) == textwrap.dedent("""\
        Tree
        ├── .a=100.0
        ├── .b:tuple
        │   ├── [0]=10.0
        │   └── [1]=3.0
        └── .c=f32[3](μ=36.33, σ=45.02, ∈[4.00,100.00])""")


def test_diagram_of_a_model_with_frozen_values_functions_and_hidden_fields():
    # a diagram is a debugging view: it shows `repr=False` fields (`cache`), as
    # PyTreeClass's does; `repr` hides them
    assert tc.tree_diagram(Model()) == textwrap.dedent("""\
        Model
        ├── .layers:list
        │   ├── [0]:Linear
        │   │   ├── .weight=f32[2,3](μ=2.50, σ=1.71, ∈[0.00,5.00])
        │   │   ├── .bias=f32[3](μ=0.00, σ=0.00, ∈[0.00,0.00])
        │   │   ├── .name='linear'
        │   │   └── .cache=0
        │   └── [1]:Linear
        │       ├── .weight=f32[3,1](μ=1.00, σ=0.00, ∈[1.00,1.00])
        │       ├── .bias=f32[1](μ=1.00, σ=0.00, ∈[1.00,1.00])
        │       ├── .name='linear'
        │       └── .cache=0
        ├── .act=relu(x)
        ├── .scale=#2.0
        └── .meta:dict
            ├── ['steps']=10
            └── ['lr']=0.001""")


def test_diagram_depth_cut_and_empty_nodes():
    tree = {"t": Tree(), "e": (), "p": Point(1, [2])}
    assert tc.tree_diagram(tree, depth=1) == textwrap.dedent("""\
        dict
        ├── ['t']=Tree(...)
        ├── ['e']=()
        └── ['p']=Point(...)""")
    assert tc.tree_diagram(tree, depth=0) == "{...}"


def test_diagram_is_leaf_and_tabwidth():
    tree = {"p": Point(1, 2), "l": [3]}
    assert tc.tree_diagram(tree, is_leaf=lambda x: isinstance(x, Point), tabwidth=2) == (
        "dict\n├ ['p']=Point(x=1, y=2)\n└ ['l']:list\n  └ [0]=3"
    )
    assert tc.tree_diagram([[1]], tabwidth=1) == "list\n└[0]:list\n └[0]=1"


def test_diagram_of_a_leaf_is_its_repr():
    assert tc.tree_diagram(jnp.ones(2)) == "f32[2](μ=1.00, σ=0.00, ∈[1.00,1.00])"


def test_diagram_indents_multiline_leaves():
    class Lines:
        def __repr__(self):
            return "one\ntwo"

    assert tc.tree_diagram([Lines(), 1]) == "list\n├── [0]=one\n│   two\n└── [1]=1"


# -- tree_summary --------------------------------------------------------------------------


def test_summary_has_one_row_per_leaf_and_totals():
    assert tc.tree_summary(Model()) == textwrap.dedent("""\
        ┌───────────────────┬──────────┬───────┬──────┬───────────┐
        │ Name              │ Type     │ Count │ Size │ Role      │
        ├───────────────────┼──────────┼───────┼──────┼───────────┤
        │ .layers[0].weight │ f32[2,3] │     6 │  24B │ trainable │
        │ .layers[0].bias   │ f32[3]   │     3 │  12B │ trainable │
        │ .layers[0].cache  │ int      │     1 │  28B │ other     │
        │ .layers[1].weight │ f32[3,1] │     3 │  12B │ trainable │
        │ .layers[1].bias   │ f32[1]   │     1 │   4B │ trainable │
        │ .layers[1].cache  │ int      │     1 │  28B │ other     │
        │ .act              │ function │     0 │  56B │ other     │
        │ .scale            │ #float   │     1 │  24B │ frozen    │
        │ .meta['lr']       │ float    │     1 │  24B │ other     │
        │ .meta['steps']    │ int      │     1 │  28B │ other     │
        ├───────────────────┼──────────┼───────┼──────┼───────────┤
        │ Σ                 │          │    13 │  52B │ trainable │
        │ Σ                 │          │     1 │  24B │ frozen    │
        │ Σ                 │          │     4 │ 164B │ other     │
        │ Σ                 │          │     0 │ 110B │ static    │
        │ Σ                 │ Model    │    18 │ 240B │           │
        └───────────────────┴──────────┴───────┴──────┴───────────┘""")


def test_summary_depth_sums_nodes_at_the_cut():
    assert tc.tree_summary(Model(), depth=1) == textwrap.dedent("""\
        ┌─────────┬──────────┬───────┬──────┬───────────┐
        │ Name    │ Type     │ Count │ Size │ Role      │
        ├─────────┼──────────┼───────┼──────┼───────────┤
        │ .layers │ list     │    15 │ 108B │ mixed     │
        │ .act    │ function │     0 │  56B │ other     │
        │ .scale  │ #float   │     1 │  24B │ frozen    │
        │ .meta   │ dict     │     2 │  52B │ other     │
        ├─────────┼──────────┼───────┼──────┼───────────┤
        │ Σ       │          │    13 │  52B │ trainable │
        │ Σ       │          │     1 │  24B │ frozen    │
        │ Σ       │          │     4 │ 164B │ other     │
        │ Σ       │          │     0 │ 110B │ static    │
        │ Σ       │ Model    │    18 │ 240B │           │
        └─────────┴──────────┴───────┴──────┴───────────┘""")


def test_summary_is_leaf_gives_one_row_per_matched_node():
    table = tc.tree_summary(Model(), is_leaf=lambda x: isinstance(x, Linear))
    rows = [line.split("│")[1:3] for line in table.splitlines()[3:5]]
    assert rows == [[" .layers[0]     ", " Linear   "], [" .layers[1]     ", " Linear   "]]
    assert "│ Σ              │ Model    │    18 │ 240B │           │" in table
    # the role totals count every leaf of a node `is_leaf` stops at
    assert "│ Σ              │          │    13 │  52B │ trainable │" in table


def test_summary_of_arrays_of_several_dtypes_and_frozen_arrays():
    tree = {
        "b": jnp.ones(3, bool),
        "c": jnp.ones(2, jnp.complex64),
        "e": jnp.zeros((0, 4)),
        "f": tc.freeze(jnp.ones((256, 1024))),
        "k": jax.random.key(1),
    }
    assert tc.tree_summary(tree) == textwrap.dedent("""\
        ┌───────┬────────────────┬─────────┬─────────┬───────────┐
        │ Name  │ Type           │   Count │    Size │ Role      │
        ├───────┼────────────────┼─────────┼─────────┼───────────┤
        │ ['b'] │ bool[3]        │       3 │      3B │ other     │
        │ ['c'] │ c64[2]         │       2 │     16B │ trainable │
        │ ['e'] │ f32[0,4]       │       0 │      0B │ trainable │
        │ ['f'] │ #f32[256,1024] │ 262,144 │ 1.00MiB │ frozen    │
        │ ['k'] │ key<fry>[]     │       1 │      8B │ other     │
        ├───────┼────────────────┼─────────┼─────────┼───────────┤
        │ Σ     │                │       2 │     16B │ trainable │
        │ Σ     │                │ 262,144 │ 1.00MiB │ frozen    │
        │ Σ     │                │       4 │     11B │ other     │
        │ Σ     │ dict           │ 262,150 │ 1.00MiB │           │
        └───────┴────────────────┴─────────┴─────────┴───────────┘""")


@pytest.mark.parametrize(
    "size, text",
    [
        (0, "0B"),
        (1023, "1023B"),
        (1024, "1.00KiB"),
        (1536, "1.50KiB"),
        (5 * 2**30, "5.00GiB"),
        (2**20 - 1, "1.00MiB"),  # rounds up to the next unit, never "1024.00KiB"
        (2**50 - 1, "1.00PiB"),
        (2**50 - 2**40, "1023.00TiB"),  # just below a unit: the lower one (no float log)
        (2**70, "1048576.00PiB"),
    ],
)
def test_summary_sizes_use_binary_units(size, text):
    assert size_text(size) == text


def test_summary_of_empty_tree_has_only_totals():
    assert tc.tree_summary({}) == textwrap.dedent("""\
        ┌──────┬──────┬───────┬──────┐
        │ Name │ Type │ Count │ Size │
        ├──────┼──────┼───────┼──────┤
        │ Σ    │ dict │     0 │   0B │
        └──────┴──────┴───────┴──────┘""")


_SHARDED_SCRIPT = """
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import treeclass as tc
mesh = jax.make_mesh((8,), ("x",))
w = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P("x", None)))
b = jax.device_put(jnp.zeros(4), NamedSharding(mesh, P()))
print(tc.tree_summary({"w": w, "b": b, "c": jnp.ones(2)}))
print(tc.tree_repr(w))
"""


def test_summary_shows_sharding_across_eight_devices():
    os = __import__("os")
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8"
    env = {"XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", _SHARDED_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, **env},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == textwrap.dedent("""\
        ┌───────┬──────────┬───────┬──────┬──────────────┐
        │ Name  │ Type     │ Count │ Size │ Sharding     │
        ├───────┼──────────┼───────┼──────┼──────────────┤
        │ ['b'] │ f32[4]   │     4 │  16B │ P()          │
        │ ['c'] │ f32[2]   │     2 │   8B │              │
        │ ['w'] │ f32[8,4] │    32 │ 128B │ P('x', None) │
        ├───────┼──────────┼───────┼──────┼──────────────┤
        │ Σ     │ dict     │    38 │ 152B │              │
        └───────┴──────────┴───────┴──────┴──────────────┘
        f32[8,4](μ=1.00, σ=0.00, ∈[1.00,1.00])
        """)


# -- statistics: at most one copy to host -------------------------------------------------------


def test_array_statistics_copy_to_host_once(monkeypatch):
    calls = []
    to_host = _pprint.to_host
    monkeypatch.setattr(_pprint, "to_host", lambda x: calls.append(1) or to_host(x))
    x = jnp.arange(1000.0)
    assert tc.tree_repr(x) == "f32[1000](μ=499.50, σ=288.67, ∈[0.00,999.00])"
    assert len(calls) == 1


def test_large_accelerator_arrays_are_reduced_on_device(monkeypatch):
    calls = []
    monkeypatch.setattr(_pprint, "to_host", lambda x: calls.append(1))
    monkeypatch.setattr(_pprint, "reduce_on_device", lambda x: x.size >= 2)
    tree = [jnp.arange(100.0), jnp.arange(10), jnp.array([1j, 3j])]
    assert tc.tree_repr(tree, width=200) == (
        "[f32[100](μ=49.50, σ=28.87, ∈[0.00,99.00]), i32[10](μ=4.50, σ=2.87, ∈[0,9]), "
        "c64[2](μ=0.00+2.00j, σ=1.00)]"
    )
    assert calls == []


# -- big arrays: bounded statistics, no full read for str ------------------------------------


def test_statistics_above_the_exact_size_are_of_a_sample_and_say_so(monkeypatch):
    monkeypatch.setattr(_pprint, "STATS_EXACT_MAX", 100)
    x = np.random.default_rng(0).normal(size=(300, 200)).astype(np.float32)
    text = tc.tree_repr(x)
    assert re.fullmatch(r"f32\[300,200\]\(sampled μ=-?0\.0\d, σ=(0\.9\d|1\.0\d), ∈\[.*\]\)", text)
    assert tc.tree_repr(x) == text  # the same elements every time
    assert tc.tree_repr(jnp.asarray(x)) == text
    assert tc.tree_repr(jnp.arange(100.0)).startswith("f32[100](μ=")  # small: exact, no mark


def test_a_sample_is_spread_over_the_whole_array(monkeypatch):
    monkeypatch.setattr(_pprint, "STATS_EXACT_MAX", 100)
    monkeypatch.setattr(_pprint, "STATS_SAMPLE_SIZE", 64)
    ramp = np.arange(100_000, dtype=np.int32)
    low, high = (int(n) for n in re.search(r"∈\[(\d+),(\d+)\]", tc.tree_repr(ramp)).groups())
    assert low < 2_000 and high > 98_000  # from both ends, not a prefix


def test_sampled_statistics_of_a_transposed_numpy_array_need_no_copy(monkeypatch):
    monkeypatch.setattr(_pprint, "STATS_EXACT_MAX", 100)
    x = np.ones((400, 300), np.float32).T  # not C-contiguous
    assert tc.tree_repr(x) == "f32[300,400](sampled μ=1.00, σ=0.00, ∈[1.00,1.00])"


@pytest.mark.parametrize("shape", [(2000,), (50, 40), (3, 400, 5), (1001, 1)])
def test_str_of_a_large_jax_array_is_numpys_text_read_from_its_corners(shape):
    x = jnp.arange(math.prod(shape), dtype=jnp.float32).reshape(shape)
    assert tc.tree_str(x) == str(np.asarray(x))
    corners = _pprint._corners(x)
    assert all(n <= 7 for n in corners.shape)


@pytest.fixture(scope="module")
def multidevice_results() -> dict:
    return run_check_script("pprint_multidevice_check.py")


@pytest.mark.parametrize(
    "check",
    [
        "small_sharded_arrays_print_exact_statistics_shard_by_shard",
        "replicated_shards_are_read_once",
        "large_sharded_arrays_show_sampled_statistics_without_a_gather",
        "str_of_a_large_sharded_array_reads_only_its_corners",
        "summary_and_diagram_of_a_sharded_model_do_not_gather",
    ],
)
def test_sharded_arrays_print_without_being_gathered(multidevice_results, check):
    assert multidevice_results[check] == "ok", multidevice_results[check]


# -- tree_graph and tree_mermaid ---------------------------------------------------------------

_DOT_NODE = re.compile(r'^    (\d+) \[label="((?:[^"\\]|\\.)*)"\];$')
_DOT_EDGE = re.compile(r"^    (\d+) -> (\d+);$")
_MERMAID_NODE = re.compile(r'^    n(\d+)\["([^"]*)"\]$')
_MERMAID_EDGE = re.compile(r"^    n(\d+) --> n(\d+)$")


def _diagram_labels(tree, **kwargs):
    """The labels of `tree_diagram`, without the box-drawing prefixes, in line order."""
    lines = tc.tree_diagram(tree, **kwargs).splitlines()
    return [re.sub(r"^[│├└─ ]*", "", line) for line in lines]


def _parse(text, node_pattern, edge_pattern, header, footer, unescape):
    lines = text.splitlines()
    assert lines[: len(header)] == header
    body = lines[len(header) : len(lines) - len(footer)]
    assert lines[len(lines) - len(footer) :] == footer
    labels, edges = {}, []
    for line in body:
        if node := node_pattern.match(line):
            labels[int(node.group(1))] = unescape(node.group(2))
        else:
            edge = edge_pattern.match(line)
            assert edge, f"not a node or an edge: {line!r}"
            edges.append((int(edge.group(1)), int(edge.group(2))))
    return [labels[n] for n in range(len(labels))], edges


def _dot_unescape(text):
    return re.sub(r"\\(.)", lambda m: {"l": "\n"}.get(m.group(1), m.group(1)), text)


def _mermaid_unescape(text):
    for code, char in (("#quot;", '"'), ("#lt;", "<"), ("#gt;", ">"), ("#35;", "#")):
        text = text.replace(code, char)
    return text


def _tree_edges(tree):
    """Parent -> child edges of the diagram, numbering lines from 0 in order."""
    lines = tc.tree_diagram(tree).splitlines()
    depth = [len(re.match(r"^[│├└─ ]*", line).group(0)) // 4 for line in lines]
    edges, stack = [], []
    for n, d in enumerate(depth):
        del stack[d:]
        if stack:
            edges.append((stack[-1], n))
        stack.append(n)
    return edges


def test_graph_parses_back_to_the_diagram():
    tree = Model()
    header = ["digraph tree {", '    node [shape=box, fontname="monospace"];']
    labels, edges = _parse(tc.tree_graph(tree), _DOT_NODE, _DOT_EDGE, header, ["}"], _dot_unescape)
    assert labels == _diagram_labels(tree)
    assert sorted(edges) == sorted(_tree_edges(tree))


def test_graph_escapes_quotes_and_backslashes():
    tree = {'say "hi"': "back\\slash"}
    header = ["digraph tree {", '    node [shape=box, fontname="monospace"];']
    labels, _ = _parse(tc.tree_graph(tree), _DOT_NODE, _DOT_EDGE, header, ["}"], _dot_unescape)
    assert labels == ["dict", "['say \"hi\"']='back\\\\slash'"]


def test_mermaid_parses_back_to_the_diagram():
    tree = Model()
    labels, edges = _parse(
        tc.tree_mermaid(tree), _MERMAID_NODE, _MERMAID_EDGE, ["flowchart LR"], [], _mermaid_unescape
    )
    assert labels == _diagram_labels(tree)
    assert sorted(edges) == sorted(_tree_edges(tree))


def test_mermaid_escapes_quotes_angles_and_hashes():
    text = tc.tree_mermaid({"a": '<"#>'})
    assert text.splitlines()[2] == "    n1[\"['a']='#lt;#quot;#35;#gt;'\"]"


def test_graph_and_mermaid_respect_depth():
    assert tc.tree_graph({"a": [1]}, depth=0).splitlines()[2] == '    0 [label="{...}"];'
    assert tc.tree_mermaid({"a": [1]}, depth=1).splitlines()[1:] == [
        '    n0["dict"]',
        "    n1[\"['a']=[...]\"]",
        "    n0 --> n1",
    ]


# -- notebook display -----------------------------------------------------------------------


def test_html_is_well_formed_with_collapsible_nodes():
    page = tree_html(Model(), open_levels=1)
    root = ET.fromstring(page)
    details = root.findall(".//details")
    assert [d.find("summary").text for d in details] == [
        "Model",
        ".layers:list",
        "[0]:Linear",
        "[1]:Linear",
        ".meta:dict",
    ]
    assert [d.get("open") for d in details] == ["open", None, None, None, None]
    leaves = [div.text for div in root.iter("div") if div.text and not list(div)]
    assert ".scale=#2.0" in leaves
    assert "cache" not in page


def test_html_escapes_markup():
    page = tree_html({"<b>": "&"})
    assert "<div>[&#x27;&lt;b&gt;&#x27;]=&#x27;&amp;&#x27;</div>" in page
    ET.fromstring(page)


def test_html_open_levels_and_leaf_root():
    page = tree_html([[1]], open_levels=2)
    assert [d.get("open") for d in ET.fromstring(page).iter("details")] == ["open", "open"]
    assert ET.fromstring(tree_html(3)).find("div").text == "3"


class Displayed(Linear):
    def _repr_html_(self):
        return tree_html(self)

    def __treescope_repr__(self, path, subtree_renderer):
        return treescope_repr(self, path, subtree_renderer)


def test_treescope_renders_fields_without_hidden_ones():
    treescope = pytest.importorskip("treescope")
    layer = Displayed(jnp.ones(2), jnp.zeros(2), cache=3)
    text = treescope.render_to_text({"layer": layer})
    assert "Displayed(" in text and "weight=" in text and "name='linear'" in text
    assert "cache" not in text
    page = treescope.render_to_html(layer)
    assert isinstance(page, str) and "treescope" in page


def test_import_treeclass_does_not_import_treescope():
    code = "import sys, treeclass; print('treescope' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.stdout.strip() == "False", result.stderr


# -- the printer registry -------------------------------------------------------------------


class Vocab:
    def __init__(self, words):
        self.words = words


class BigVocab(Vocab):
    pass


@pytest.fixture
def vocab_rule():
    register_printer(
        Vocab,
        repr=lambda v: f"Vocab[{len(v.words)}]",
        str=lambda v: " ".join(v.words),
        type_name=lambda v: f"vocab[{len(v.words)}]",
        count=lambda v: len(v.words),
        size=lambda v: 8 * len(v.words),
    )
    yield
    register_printer(Vocab)


def test_registered_type_is_shown_by_every_printer(vocab_rule):
    tree = {"v": BigVocab(["a", "b"])}
    assert tc.tree_repr(tree) == "{'v': Vocab[2]}"
    assert tc.tree_str(tree) == "{'v': a b}"
    assert tc.tree_diagram(tree) == "dict\n└── ['v']=Vocab[2]"
    assert "│ ['v'] │ vocab[2] │     2 │  16B │" in tc.tree_summary(tree)
    assert "['v']=Vocab[2]" in tc.tree_graph(tree) and "Vocab[2]" in tc.tree_mermaid(tree)
    assert "<div>[&#x27;v&#x27;]=Vocab[2]</div>" in tree_html(tree)


def test_registered_rule_makes_a_pytree_node_print_as_a_leaf():
    register_printer(Point, repr=lambda p: f"<{p.x},{p.y}>")
    try:
        assert tc.tree_repr([Point(1, 2)]) == "[<1,2>]"
        assert tc.tree_diagram([Point(1, 2)]) == "list\n└── [0]=<1,2>"
    finally:
        register_printer(Point)
    assert tc.tree_repr([Point(1, 2)]) == "[Point(x=1, y=2)]"


def test_unregistering_restores_the_default():
    register_printer(Vocab, repr=lambda v: "V")
    register_printer(Vocab)
    assert tc.tree_repr(Vocab([])).startswith("<")
    assert _pprint_registry.rule_for(Vocab([])) is None


def test_register_printer_rejects_bad_arguments():
    with pytest.raises(TypeError, match=r"expects a class as its first argument, got 3"):
        register_printer(3, repr=str)
    with pytest.raises(
        TypeError,
        match=r"register_printer\(\.\.\., count=\.\.\.\)` expects a "
        r"callable or None, got 5",
    ):
        register_printer(Vocab, count=5)


# -- tree_repr_with_trace ---------------------------------------------------------------------


def test_repr_with_trace_replaces_each_leaf_with_its_table():
    # PyTreeClass v0.4's trace: the types below the root, ending with the leaf's own
    traced = tc.tree_repr_with_trace(Tree())
    assert isinstance(traced, Tree)
    assert traced.b[1] == textwrap.dedent("""\
        ┌───────────┬──────────────┐
        │ Value     │ 3.0          │
        ├───────────┼──────────────┤
        │ Name path │ .b->[1]      │
        ├───────────┼──────────────┤
        │ Type path │ tuple->float │
        └───────────┴──────────────┘""")


def test_repr_with_trace_prints_tables_in_place():
    text = str(tc.tree_repr_with_trace(Tree(a=1, b=(), c=jnp.ones(1))))
    assert text == textwrap.dedent("""\
        Tree(
          a=┌───────────┬─────┐
            │ Value     │ 1   │
            ├───────────┼─────┤
            │ Name path │ .a  │
            ├───────────┼─────┤
            │ Type path │ int │
            └───────────┴─────┘,
          b=(),
          c=┌───────────┬──────────────────────────────────────┐
            │ Value     │ f32[1](μ=1.00, σ=0.00, ∈[1.00,1.00]) │
            ├───────────┼──────────────────────────────────────┤
            │ Name path │ .c                                   │
            ├───────────┼──────────────────────────────────────┤
            │ Type path │ Array                                │
            └───────────┴──────────────────────────────────────┘
        )""")
    assert repr(tc.tree_repr_with_trace(Tree(a=1, b=(), c=jnp.ones(1)))) == text


def test_repr_with_trace_writes_the_name_path_as_pytreeclass_v04_did():
    # v0.4 joined the key entries with `->`, as it joins the types: `.b->.c->[0]`
    class Outer(tc.TreeClass):
        def __init__(self):
            self.b = Inner()

    class Inner(tc.TreeClass):
        def __init__(self):
            self.c = [1.0]
            self.d = {"e": 2}

    traced = tc.tree_repr_with_trace(Outer())
    assert "│ Name path │ .b->.c->[0]" in traced.b.c[0]
    assert "│ Type path │ Inner->list->float" in traced.b.c[0]
    assert "│ Name path │ .b->.d->['e']" in traced.b.d["e"]


def test_repr_with_trace_transposed_has_a_header_row():
    assert tc.tree_repr_with_trace([Point(1.0, "s")], transpose=True)[0].y == textwrap.dedent(
        """\
        ┌───────┬───────────┬────────────┐
        │ Value │ Name path │ Type path  │
        ├───────┼───────────┼────────────┤
        │ 's'   │ [0]->.y   │ Point->str │
        └───────┴───────────┴────────────┘"""
    )


def test_repr_with_trace_of_a_bare_leaf_has_empty_paths():
    row = tc.tree_repr_with_trace(2, None, True).splitlines()[3]
    assert row == "│ 2     │           │           │"


def test_repr_with_trace_keeps_frozen_values_and_respects_is_leaf():
    traced = tc.tree_repr_with_trace(
        {"f": tc.freeze(1), "p": Point(1, 2)}, is_leaf=lambda x: isinstance(x, Point)
    )
    assert tc.is_frozen(traced["f"])
    assert "│ Value     │ Point(x=1, y=2)" in traced["p"]


# -- laws ----------------------------------------------------------------------------------

_atoms = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
)
_trees = st.recursive(
    _atoms,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.text(max_size=3), inner, max_size=4),
    ),
    max_leaves=20,
)


@settings(max_examples=40, deadline=None)
@given(tree=_trees, width=st.integers(0, 60), tabwidth=st.integers(0, 4))
def test_repr_of_python_data_evaluates_back_at_any_width(tree, width, tabwidth):
    text = tc.tree_repr(tree, width=width, tabwidth=tabwidth)
    assert ast.literal_eval(text) == tree
    assert tc.tree_repr(tree, width=math.inf) == repr(tree)


_small_trees = st.recursive(
    st.integers(-9, 9),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.sampled_from("ab"), inner, max_size=2),
    ),
    max_leaves=12,
)


def _nesting(tree):
    children = tree.values() if isinstance(tree, dict) else tree
    if not isinstance(tree, (list, tuple, dict)):
        return 0
    return 1 + max((_nesting(child) for child in children), default=0)


@settings(max_examples=40, deadline=None)
@given(tree=_small_trees, extra=st.integers(0, 40))
def test_every_line_fits_the_width_when_each_value_does(tree, extra):
    # the longest unbreakable line is an indented `'a': -9,` or `'a': [`
    width = 2 * _nesting(tree) + len("'a': -9,") + extra
    lines = tc.tree_repr(tree, width=width).splitlines()
    assert max(map(len, lines)) <= width


def _entry_count(tree):
    if isinstance(tree, (list, tuple, dict)) and tree:
        children = tree.values() if isinstance(tree, dict) else tree
        return 1 + sum(_entry_count(child) for child in children)
    return 1


@settings(max_examples=40, deadline=None)
@given(tree=_trees)
def test_summary_has_a_row_per_leaf_and_diagram_a_line_per_entry(tree):
    leaves = jax.tree_util.tree_leaves(tree)
    rows = tc.tree_summary(tree).splitlines()
    # below the total, one `Σ` row per role when not every leaf is trainable
    roles = set(jax.tree_util.tree_leaves(tc.roles(tree)))
    footer = len(roles) if roles - {"trainable"} else 0
    assert len(rows) == (len(leaves) + 6 + footer if leaves else 5)
    assert rows[-2].startswith("│ Σ ")
    assert len(tc.tree_diagram(tree).splitlines()) == _entry_count(tree)


# -- documentation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "obj",
    [*PRINTERS, tc.tree_repr_with_trace, _pprint.array_repr, treescope_repr, register_printer],
    ids=lambda obj: obj.__name__,
)
def test_docstring_examples_run(obj):
    blocks = re.findall(r"```python\n(.*?)```", obj.__doc__, re.DOTALL)
    assert blocks
    for block in blocks:
        exec(textwrap.dedent(block), {})


# -- one frozen repr --------------------------------------------------------------------------


@pytest.mark.parametrize("value", [jax.nn.relu, jnp.arange(3), {"a": [1, "x"]}, "relu", 2.0])
def test_frozen_repr_is_its_tree_repr(value):
    frozen = tc.freeze(value)
    assert repr(frozen) == tc.tree_repr(frozen) == "#" + tc.tree_repr(value)
    assert str(frozen) == tc.tree_str(frozen) == "#" + tc.tree_str(value)


def test_frozen_function_reads_as_its_signature():
    assert repr(tc.freeze(jax.nn.relu)) == "#relu(x)"
    assert tc.tree_diagram({"f": tc.freeze(jax.nn.relu)}) == "dict\n└── ['f']=#relu(x)"


# -- str and repr of leaves, hidden fields ----------------------------------------------------


def test_str_prints_string_leaves_unquoted_and_repr_quotes_them():
    layer = Linear(jnp.ones(1), jnp.ones(1), name="dense")
    assert "name=dense" in str(layer) and "name='dense'" in repr(layer)
    assert tc.tree_str({"k": "v"}) == "{'k': v}"  # keys stay as Python writes them


def test_pictures_show_repr_false_fields_and_repr_and_html_hide_them():
    layer = Linear(jnp.ones(1), jnp.ones(1), cache=7)
    assert ".cache=7" in tc.tree_diagram(layer)
    assert ".cache=7" in tc.tree_graph(layer) and ".cache=7" in tc.tree_mermaid(layer)
    assert "cache" not in repr(layer) and "cache" not in str(layer)
    assert "cache" not in tree_html(layer)
    assert "│ .cache  │ int" in tc.tree_summary(layer)  # summary counts every leaf


# -- runs of repeated siblings ------------------------------------------------------------------


class Block(tc.TreeClass):
    weight: jax.Array
    bias: jax.Array
    name: str = tc.field(static=True)


class Deep(tc.TreeClass):
    def __init__(self, count, size=2):
        self.layers = tuple(
            Block(jnp.full((size, size), float(i)), jnp.zeros(size), f"layer{i}")
            for i in range(count)
        )


def test_repr_folds_the_middle_of_a_long_run_of_same_structure_layers():
    assert tc.tree_repr(Deep(10), depth=2, width=60) == textwrap.dedent("""\
        Deep(
          layers=(
            Block(...),
            Block(...),
            Block(...),
            … 4 more Block(weight=f32[2,2], bias=f32[2], name=str) …,
            Block(...),
            Block(...),
            Block(...)
          )
        )""")
    lines = tc.tree_repr(Deep(10), width=200).splitlines()
    assert len(lines) == 11
    assert "name='layer2'" in lines[4] and "name='layer7'" in lines[6]


def test_repeats_none_prints_every_child_and_the_keyword_sets_the_ends():
    model = Deep(10)
    assert tc.tree_repr(model, repeats=None) == tc.tree_repr(model, repeats=5)
    assert tc.tree_repr(model, repeats=None).count("Block(") == 10
    assert tc.tree_repr(model, repeats=1, width=300).count("Block(") == 3  # 2 + the run
    assert "… 10 more Block(" in tc.tree_repr(model, repeats=0)
    assert "… 3 more" in tc.tree_str(Deep(9), repeats=3)


def test_runs_of_at_most_two_ends_plus_one_are_shown_whole():
    assert "more" not in tc.tree_repr(Deep(7))
    assert "… 2 more" in tc.tree_repr(Deep(8))


def test_plain_values_never_fold_and_different_structures_break_runs():
    assert tc.tree_repr(list(range(20)), width=200) == repr(list(range(20)))
    mixed = [jnp.zeros(2)] * 4 + [jnp.zeros(3)] * 4
    assert "more" not in tc.tree_repr(mixed, width=1000)
    assert "… 3 more f32[2] …" in tc.tree_repr([jnp.zeros(2)] * 9, width=1000)


def test_runs_fold_in_dicts_and_frozen_values_fold_by_their_value():
    tree = {f"w{i}": tc.freeze(jnp.ones(2)) for i in range(9)}
    assert "… 3 more #f32[2] …" in tc.tree_repr(tree, width=1000)


def test_long_run_signatures_are_cut_to_the_type_name():
    nested = [{"deep": {f"k{j}": jnp.ones(1) for j in range(10)}} for _ in range(9)]
    assert "… 3 more dict(...) …" not in tc.tree_repr(nested)
    assert "… 3 more {...} …" in tc.tree_repr(nested)


def test_folded_children_are_never_summarised(monkeypatch):
    calls = []
    real = _pprint.to_host
    monkeypatch.setattr(_pprint, "to_host", lambda x: calls.append(1) or real(x))
    tc.tree_repr(Deep(1000))
    assert len(calls) == 2 * 6  # three layers at each end, two arrays each


@pytest.mark.parametrize("repeats", [-1, 1.5, True, "3"])
def test_bad_repeats_raise(repeats):
    error = ValueError if repeats == -1 else TypeError
    for printer in (tc.tree_repr, tc.tree_diagram, tc.tree_summary, tree_html):
        with pytest.raises(error, match=r"`repeats` must be None"):
            printer([1], repeats=repeats)


def test_diagram_graph_and_mermaid_show_a_run_as_one_entry():
    diagram = tc.tree_diagram(Deep(9), depth=2)
    assert "    ├── [3]…[5]: 3 more Block(weight=f32[2,2], bias=f32[2], name=str)" in diagram
    assert len(diagram.splitlines()) == 2 + 7
    assert "3 more Block(" in tc.tree_graph(Deep(9)) and "3 more Block(" in tc.tree_mermaid(Deep(9))
    assert "more" not in tc.tree_diagram(Deep(9), repeats=None)


def test_summary_gives_a_run_one_row_with_its_count_and_totals():
    model = Deep(1000)
    table = tc.tree_summary(model)
    assert "│ .layers[3]…[996]    │ 994 × Block │ 5,964 │ 23.30KiB │" in table
    full = tc.tree_summary(model, repeats=None)
    assert table.splitlines()[-2].split() == full.splitlines()[-2].split()  # same totals
    assert len(full.splitlines()) == 2000 + 6
    rows = tc.tree_summary(model, repeats=0).splitlines()
    assert rows[3] == "│ .layers[0]…[999] │ 1000 × Block │ 6,000 │ 23.44KiB │"
    assert len(rows) == 7


def test_summary_runs_of_leaves_name_their_type():
    table = tc.tree_summary({"w": [jnp.ones(2)] * 9}, repeats=1)
    assert "│ ['w'][1]…[7] │ 7 × f32[2] │    14 │  56B │" in table


# -- PyTreeClass's printing hooks ---------------------------------------------------------------


class Token:
    pass


@pytest.fixture
def forget_token():
    yield
    register_printer(Token)
    register_printer(list)


def test_def_type_count_and_size_set_one_field_each_of_one_rule(forget_token):
    @tc.tree_summary.def_type(Token)
    def _(token):
        return "token"

    assert tc.tree_summary.def_count(Token, lambda t: 7) is not None
    tc.tree_summary.def_size(Token)(lambda t: 1024)
    rule = _pprint_registry.rule_for(Token())
    assert (rule.type_name(Token()), rule.count(Token()), rule.size(Token())) == ("token", 7, 1024)
    assert "│ [0]  │ token │     7 │ 1.00KiB │" in tc.tree_summary([Token()])
    tc.tree_summary.def_count(Token, None)  # the other fields stay
    assert "│ [0]  │ token │     0 │ 1.00KiB │" in tc.tree_summary([Token()])


def test_def_size_alone_keeps_the_default_count(forget_token):
    tc.tree_summary.def_size(int)(lambda n: 4)
    try:
        assert "│ [0]  │ int  │     1 │   4B │" in tc.tree_summary([5])
    finally:
        register_printer(int)


def test_def_nodestyle_styles_graph_nodes_and_keeps_nodes_open(forget_token):
    @tc.tree_graph.def_nodestyle(list)
    def _(value):
        return {"shape": "circle", "fillcolor": 'light"blue', "style": "filled"}

    dot = tc.tree_graph({"a": [1]})
    assert (
        '1 [label="[\'a\']:list", shape="circle", fillcolor="light\\"blue", style="filled"];' in dot
    )
    assert '0 [label="dict"];' in dot and tc.tree_repr({"a": [1]}) == "{'a': [1]}"


def test_def_aliases_reject_non_types():
    with pytest.raises(TypeError, match=r"`tree_summary.def_type` expects a class"):
        tc.tree_summary.def_type("int")


def test_def_aliases_have_docstrings_with_examples():
    for alias in (
        tc.tree_summary.def_type,
        tc.tree_summary.def_count,
        tc.tree_summary.def_size,
        tc.tree_graph.def_nodestyle,
    ):
        blocks = re.findall(r"```python\n(.*?)```", alias.__doc__, re.DOTALL)
        assert blocks and "register_printer" in alias.__doc__
        exec(blocks[0], {})


# -- printer rules that return the wrong thing ----------------------------------------------


class Ticket:
    """A type of its own for the rule-checking tests (each test forgets its rule)."""


@pytest.fixture
def forget_ticket():
    yield
    register_printer(Ticket)


_PRINTER_OF_FIELD = {
    "repr": tc.tree_repr,
    "str": tc.tree_str,
    "type_name": tc.tree_summary,
    "count": tc.tree_summary,
    "size": tc.tree_summary,
    "nodestyle": tc.tree_graph,
}


@pytest.mark.parametrize(
    ("field", "result", "error"),
    [
        ("repr", 5, TypeError),
        ("repr", None, TypeError),
        ("str", b"bytes", TypeError),
        ("type_name", 7, TypeError),
        ("count", "seven", TypeError),
        ("count", 2.0, TypeError),
        ("count", True, TypeError),
        ("count", -1, ValueError),
        ("size", 1.5, TypeError),
        ("size", -8, ValueError),
        ("nodestyle", ["shape"], TypeError),
        ("nodestyle", "shape=box", TypeError),
        ("nodestyle", {"shape": None}, TypeError),
        ("nodestyle", {"shape": ["box"]}, TypeError),
        ("nodestyle", {1: "box"}, TypeError),
    ],
)
def test_rule_with_a_wrong_result_names_the_rule_and_the_type(forget_ticket, field, result, error):
    register_printer(Ticket, **{field: lambda value: result})
    with pytest.raises(error, match=rf"`{field}` printer rule for `Ticket`") as info:
        _PRINTER_OF_FIELD[field]({"a": Ticket()})
    assert f"returned {describe(result)} for a `Ticket`" in str(info.value)


@pytest.mark.parametrize(
    ("alias", "spelling", "printer"),
    [
        (tc.tree_summary.def_type, "tree_summary.def_type", tc.tree_summary),
        (tc.tree_summary.def_count, "tree_summary.def_count", tc.tree_summary),
        (tc.tree_summary.def_size, "tree_summary.def_size", tc.tree_summary),
        (tc.tree_graph.def_nodestyle, "tree_graph.def_nodestyle", tc.tree_graph),
    ],
)
def test_def_alias_rule_with_a_wrong_result_names_its_spelling(
    forget_ticket, alias, spelling, printer
):
    alias(Ticket, lambda value: object())
    with pytest.raises(TypeError, match=r"\(an `object`\) for a `Ticket`") as info:
        printer([Ticket()])
    assert f"`tc.{spelling}(Ticket)`" in str(info.value)


def test_rule_that_raises_gets_a_note_naming_it(forget_ticket):
    register_printer(Ticket, repr=lambda value: 1 / 0)
    with pytest.raises(ZeroDivisionError) as info:
        tc.tree_repr([Ticket()])
    if sys.version_info >= (3, 11):
        assert any("`repr` printer rule for `Ticket`" in n for n in info.value.__notes__)


def test_rule_results_of_numpy_integers_and_str_subclasses_are_accepted(forget_ticket):
    class Name(str):
        pass

    register_printer(
        Ticket, type_name=lambda v: Name("ticket"), count=lambda v: np.int64(3), size=lambda v: 8
    )
    assert "│ [0]  │ ticket │     3 │   8B │" in tc.tree_summary([Ticket()])


@pytest.mark.parametrize(
    "name", ["shape];x", "shape x", 'shape"', "1shape", "", "node", "Edge", "fill-color", "a=b"]
)
def test_nodestyle_attribute_names_must_be_graphviz_names(forget_ticket, name):
    tc.tree_graph.def_nodestyle(Ticket, lambda value: {name: "box"})
    with pytest.raises(ValueError, match=r"is not a graphviz attribute name"):
        tc.tree_graph({"a": Ticket()})


def _dot_statements(dot: str) -> list[str]:
    """The node statements of a graph, split outside quoted strings."""
    statements, current, quoted, escaped = [], "", False, False
    for char in dot:
        current += char
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char in ";\n{}" and not quoted:
            if current.strip(" ;\n{}"):
                statements.append(current.strip(" ;\n{}"))
            current = ""
    assert not quoted
    return statements


@given(st.text(max_size=20))
@settings(max_examples=60, deadline=None)
def test_nodestyle_values_cannot_inject_dot(value):
    tc.tree_graph.def_nodestyle(Ticket, lambda _: {"shape": value, "penwidth": 2, "filled": True})
    try:
        dot = tc.tree_graph({"a": Ticket()})
    finally:
        register_printer(Ticket)
    statements = _dot_statements(dot)
    # the graph keeps exactly its header, its two nodes and its one edge
    assert len(statements) == 5, statements
    styled = statements[3]
    assert styled.startswith("1 [label=") and styled.endswith('penwidth="2", filled="true"]')
