"""PyTreeClass code runs unchanged: one section per PyTreeClass behaviour we match.

Every test here is written the way PyTreeClass users write code (`import treeclass as tc`
in place of `import pytreeclass as tc`, `@tc.autoinit`, `tc.field(on_setattr=...)`,
`tree.at[...]`, `tc.tree_map_with_trace` with `Dropout in trace[1]`), so a failure means a
PyTreeClass program would break. The tests are our own, not PyTreeClass's. A section is
headed `# -- <item>: <what>`; add new items as new sections, one test per behaviour.
Deliberate differences from PyTreeClass are listed in docs/migrating.md, not tested here.
"""

from __future__ import annotations

import inspect
import re
import threading
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import treeclass as tc

# -- 14.9: leaf semantics -------------------------------------------------------------------


def test_tree_equals_itself_after_jit_turned_its_leaves_into_arrays():
    @tc.autoinit
    class Tree(tc.TreeClass):
        a: int
        b: float

    tree = Tree(0, 0.5)
    jitted = jax.jit(lambda t: t)(tree)
    assert isinstance(jitted.a, jax.Array)
    assert tc.is_tree_equal(tree, jitted)
    assert tc.is_tree_equal(jitted, tree)


def test_is_tree_equal_compares_int_and_float_leaves_by_value():
    @tc.autoinit
    class Tree(tc.TreeClass):
        a: int = 1

    assert tc.is_tree_equal(Tree(1), Tree(1.0))
    assert Tree(1) == Tree(1.0) and hash(Tree(1)) == hash(Tree(1.0))


def test_is_tree_equal_arrays_need_the_same_shape_and_dtype():
    assert not tc.is_tree_equal(jnp.ones(2), jnp.ones(3))
    assert not tc.is_tree_equal(jnp.ones(2), jnp.ones(2, dtype=jnp.int32))
    assert not tc.is_tree_equal(jnp.array([jnp.nan]), jnp.array([jnp.nan]))


def test_is_tree_equal_under_jit_is_a_traced_bool():
    assert jax.jit(lambda x, y: tc.is_tree_equal(x, y))(jnp.ones(2), jnp.ones(2))


def test_divmod_of_a_leafwise_tree_gives_one_tree_of_pairs():
    @tc.leafwise
    @tc.autoinit
    class Tree(tc.TreeClass):
        a: int = 7
        b: float = 9.0

    assert divmod(Tree(), 2) == Tree(a=(3, 1), b=(4.0, 1.0))
    assert divmod(20, Tree()) == Tree(a=(2, 6), b=(2.0, 2.0))


def test_bcmap_broadcasts_an_argument_of_another_structure():
    assert tc.bcmap(lambda x, y: x + y)([1, 2, 3], 1) == [2, 3, 4]
    assert tc.bcmap(lambda x, y: x + y)([1, 2, 3], [1, 2, 3]) == [2, 4, 6]
    with pytest.raises(TypeError, match="unsupported operand type"):
        tc.bcmap(lambda x, y: x + y)([1, 2, 3], [[1, 2, 3], [1, 2, 3]])


def test_bcmap_where_on_a_leafwise_tree():
    @tc.autoinit
    @tc.leafwise
    class Test(tc.TreeClass):
        a: tuple = (1, 2, 3)
        b: tuple = (4, 5, 6)
        c: jax.Array = jnp.array([1, 2, 3])

    tree = Test()
    out = tc.bcmap(jnp.where)(tree > 1, tree, 0)
    assert [x.tolist() for x in jax.tree_util.tree_leaves(out)] == [
        0,
        2,
        3,
        4,
        5,
        6,
        [0, 2, 3],
    ]


def test_bcmap_with_only_keyword_arguments_maps_over_the_first():
    out = tc.bcmap(lambda x, y: x * y)(x={"a": 1, "b": 2}, y=10)
    assert out == {"a": 10, "b": 20}


def test_partial_has_no_leaves_and_is_hashable_and_comparable():
    def f(a, b, c):
        return a + b + c

    f_a = tc.Partial(f, ..., 2, 3)
    assert f_a(1) == 6
    assert tc.Partial(f, b=2, c=3)(1) == 6
    assert jax.tree_util.tree_leaves(f_a) == []
    assert f_a == tc.Partial(f, ..., 2, 3) and hash(f_a) == hash(tc.Partial(f, ..., 2, 3))
    assert jax.jit(lambda g, x: g(x))(f_a, 1.0) == 6.0


# -- path traces: the PyTreeClass v0.4 semantics ----------------------------------------------


@tc.autoinit
class Linear(tc.TreeClass):
    weight: jax.Array = jnp.ones((2, 2))
    bias: jax.Array = jnp.zeros(2)


@tc.autoinit
class Dropout(tc.TreeClass):
    drop_rate: float = 0.5


class Net(tc.TreeClass):
    def __init__(self):
        self.l1 = Linear()
        self.drop = Dropout()
        self.l2 = Linear()


def test_map_with_trace_freezes_every_leaf_inside_a_dropout():
    net = tc.tree_map_with_trace(
        lambda trace, leaf: tc.freeze(leaf) if Dropout in trace[1] else leaf, Net()
    )
    assert tc.is_frozen(net.drop.drop_rate)
    assert not tc.is_frozen(net.l1.weight)


def test_trace_names_are_key_entries_and_types_start_below_the_root():
    [(names, types), _] = tc.tree_leaves_with_trace(Net())[0]
    assert names == (jax.tree_util.GetAttrKey("l1"), jax.tree_util.GetAttrKey("weight"))
    assert types[0] is Linear and len(types) == len(names)
    assert Net not in types


def test_map_with_trace_selects_by_a_name_on_the_path():
    def scale_biases(trace, leaf):
        names, _ = trace
        return leaf + 100 if jax.tree_util.GetAttrKey("bias") in names else leaf

    net = tc.tree_map_with_trace(scale_biases, Net())
    assert net.l1.bias.tolist() == [100.0, 100.0] and net.l1.weight.tolist()[0] == [1.0, 1.0]


def test_map_with_trace_selects_by_dict_key_and_list_type():
    tree = {"a": [1, 2], "b": 4, "c": [5, 6]}
    by_key = tc.tree_map_with_trace(
        lambda t, x: x + 100 if jax.tree_util.DictKey("a") in t[0] else x, tree
    )
    assert by_key == {"a": [101, 102], "b": 4, "c": [5, 6]}
    by_type = tc.tree_map_with_trace(lambda t, x: x + 100 if list in t[1] else x, tree)
    assert by_type == {"a": [101, 102], "b": 4, "c": [105, 106]}


def test_a_bare_leaf_has_an_empty_trace():
    assert tc.tree_leaves_with_trace(1) == [(((), ()), 1)]


def test_leaves_with_trace_is_trace_leaf_stops_at_a_depth():
    traced = tc.tree_leaves_with_trace(Net(), is_trace_leaf=lambda trace: len(trace[0]) == 1)
    assert [type(leaf) for _, leaf in traced] == [Linear, Dropout, Linear]


def test_repr_with_trace_shows_value_name_path_and_type_path():
    text = str(tc.tree_repr_with_trace({"a": [2]}))
    assert "Value" in text and "Name path" in text and "Type path" in text
    assert "['a']->[0]" in text and "list->int" in text  # v0.4's paths
    header = str(tc.tree_repr_with_trace({"a": [2]}, transpose=True)).splitlines()[1]
    assert [cell.strip() for cell in header.split("│")[1:4]] == ["Value", "Name path", "Type path"]


def test_map_with_trace_is_trace_leaf_hands_whole_dropouts_to_the_function():
    net = tc.tree_map_with_trace(
        lambda trace, node: tc.freeze(node) if type(node) is Dropout else node,
        Net(),
        is_trace_leaf=lambda trace: len(trace[1]) > 0 and trace[1][-1] is Dropout,
    )
    assert tc.is_frozen(net.drop) and not tc.is_frozen(net.l1.weight)


# -- 14.1: is_parallel on .at[...].get / set / apply -----------------------------------------


@tc.autoinit
class Files(tc.TreeClass):
    first: str = "a.bin"
    second: str = "b.bin"
    third: str = "c.bin"


def test_is_parallel_runs_on_worker_threads_and_keeps_leaf_order():
    # the first call can only return once the last one has run: so the calls overlap,
    # and they finish out of order, yet the results come back in leaf order
    last_started = threading.Event()
    callers = []

    def load(name):
        callers.append(threading.get_ident())
        if name == "a.bin":
            assert last_started.wait(timeout=30), "the calls did not run concurrently"
        if name == "c.bin":
            last_started.set()
        return name.upper()

    loaded = Files().at[...].apply(load, is_parallel={"max_workers": 3})
    assert loaded == Files("A.BIN", "B.BIN", "C.BIN")
    assert threading.get_ident() not in callers


def test_is_parallel_true_gives_what_the_serial_path_gives():
    tree = Files()
    for parallel in (True, {"max_workers": 2}):
        assert tree.at[...].apply(str.upper, is_parallel=parallel) == tree.at[...].apply(str.upper)
        assert tree.at["second"].get(is_parallel=parallel) == tree.at["second"].get()
        assert tree.at["first", "third"].set("x.bin", is_parallel=parallel) == Files(
            "x.bin", "b.bin", "x.bin"
        )


def test_is_parallel_reraises_a_leaf_error_with_its_key_path():
    def load(name):
        if name == "b.bin":
            raise FileNotFoundError(name)
        return name

    with pytest.raises(FileNotFoundError) as info:
        Files().at[...].apply(load, is_parallel=True)
    notes = getattr(info.value, "__notes__", [])
    assert any(".second" in note and "is_parallel" in note for note in notes), notes


def test_is_parallel_refuses_traced_leaves_under_jit():
    tree = tc.at({"w": jnp.ones(2)})

    @jax.jit
    def step(params):
        return tc.at(params)[...].apply(jnp.sin, is_parallel=True)

    assert tree[...].apply(jnp.sin, is_parallel=True)["w"].shape == (2,)
    with pytest.raises(ValueError, match="`is_parallel` cannot be used on traced values"):
        step({"w": jnp.ones(2)})


def test_is_parallel_rejects_anything_but_a_bool_or_a_dict():
    with pytest.raises(TypeError, match="ThreadPoolExecutor"):
        Files().at[...].apply(str.upper, is_parallel="yes")


# -- 14.2: tree_mask(tree, mask=...) ---------------------------------------------------------


@tc.autoinit
class Conv(tc.TreeClass):
    weight: jax.Array = jnp.ones((3, 3))
    act: Any = jax.nn.relu
    stride: int = 2


def test_tree_mask_takes_pytreeclass_mask_keyword_as_predicate():
    masked = tc.tree_mask(Conv(), mask=lambda x: not isinstance(x, jax.Array))
    assert tc.is_frozen(masked.act) and tc.is_frozen(masked.stride)
    assert jax.tree_util.tree_leaves(masked) == [masked.weight]
    assert tc.tree_unmask(masked, mask=lambda x: True) == Conv()


def test_tree_mask_takes_a_bool_mask_tree():
    tree = {"a": 1, "b": jnp.ones(2)}
    masked = tc.tree_mask(tree, mask={"a": True, "b": False})
    assert tc.is_frozen(masked["a"]) and not tc.is_frozen(masked["b"])


def test_tree_mask_default_freezes_the_non_differentiable():
    masked = tc.tree_mask(Conv())
    grads = jax.grad(lambda c: tc.tree_unmask(c).weight.sum())(masked)
    assert grads.weight.shape == (3, 3)


def test_tree_mask_refuses_mask_and_cond_together():
    with pytest.raises(TypeError, match="not both"):
        tc.tree_mask(Conv(), mask=lambda x: True, cond=lambda x: True)


# -- 14.3: BaseKey.def_alias and autoinit.register_excluded_type ------------------------------


class FieldName:
    """An index type of the user's, converted to a key matcher by `def_alias`."""

    def __init__(self, name):
        self.name = name


class _NameMatcher(tc.BaseKey):
    def __init__(self, name):
        self.name = name

    def __eq__(self, key):
        return getattr(key, "name", None) == self.name

    __hash__ = None


tc.BaseKey.def_alias(FieldName)(lambda index: _NameMatcher(index.name))


def test_def_alias_turns_a_user_index_type_into_a_key_matcher():
    assert Files().at[FieldName("second")].get() == Files(None, "b.bin", None)
    assert Files().at[FieldName("third")].set("z") == Files("a.bin", "b.bin", "z")


def test_register_excluded_type_refuses_that_default_with_the_reason():
    class Registry:
        pass

    tc.autoinit.register_excluded_type(Registry, reason="a registry is shared state")
    with pytest.raises(TypeError, match="a registry is shared state"):

        @tc.autoinit
        class Model(tc.TreeClass):
            registry: Registry = Registry()

    @tc.autoinit
    class Ok(tc.TreeClass):  # a factory makes one per instance
        registry: Registry = tc.field(factory=Registry)

    assert Ok().registry is not Ok().registry


# -- 14.4: a field is a descriptor outside TreeClass -----------------------------------------


def test_autoinit_plain_class_runs_on_setattr_and_on_getattr():
    @tc.autoinit
    class Counter:
        count: int = tc.field(default=0, on_setattr=[int], on_getattr=[lambda n: n * 10])

    counter = Counter(2.9)
    assert vars(counter) == {"count": 2}
    assert counter.count == 20
    counter.count = "4"  # a plain class stays mutable, and every assignment converts
    assert vars(counter) == {"count": 4}


def test_undecorated_subclass_of_an_autoinit_class_keeps_the_callbacks():
    @tc.autoinit
    class Parent:
        a: int = tc.field(on_getattr=[lambda x: x + 1])

    class Child(Parent):
        pass

    child = Child(a=1)
    assert child.a == 2 and vars(child)["a"] == 1


def test_autoinit_on_a_subclass_of_a_plain_class_runs_the_base_callbacks():
    class Base:
        a: int = tc.field(on_setattr=[abs])

    @tc.autoinit
    class Derived(Base):
        b: int = tc.field(on_setattr=[abs])

    assert vars(Derived(-1, -2)) == {"a": 1, "b": 2}


def test_field_in_an_undecorated_class_runs_callbacks_in_its_own_init():
    def print_and_return(x):
        seen.append(x)
        return x

    seen = []

    class Tree:
        a: int = tc.field(on_setattr=[print_and_return])

        def __init__(self, a):
            self.a = a

    Tree(1)
    assert seen == [1]


def test_class_level_access_of_a_plain_class_field_is_the_field():
    class Tree:
        a: int = tc.field(default=1, metadata={"unit": "m"})
        b = tc.field(default=2)  # not annotated: no type

    assert isinstance(Tree.a, tc.Field)
    assert (Tree.a.name, Tree.a.type, Tree.a.metadata["unit"]) == ("a", "int", "m")
    assert (Tree.b.name, Tree.b.type) == ("b", None)
    assert (Tree().a, Tree().b) == (1, 2)  # never assigned: the default


def test_class_level_access_of_a_treeclass_field_is_the_default():
    @tc.autoinit
    class Tree(tc.TreeClass):
        a: int = tc.field(default=1, on_getattr=[lambda x: x + 1])

    assert Tree.a == 1 and Tree().a == 2
    assert tc.fields(Tree)[0].on_getattr


def test_plain_class_field_without_default_is_missing_until_assigned():
    class Tree:
        a: int = tc.field(on_setattr=[int])

    with pytest.raises(AttributeError, match="has no attribute 'a'"):
        _ = Tree().a
    tree = Tree()
    tree.a = "3"
    assert tree.a == 3
    del tree.a
    assert not hasattr(tree, "a")


# -- 14.5: on_setattr errors keep their type and name the field --------------------------------


def _range_validator(low, high):
    def validate(value):
        if not low <= value <= high:
            raise ValueError(f"value {value} is not in [{low}, {high}]")
        return value

    return validate


def test_on_setattr_error_of_generated_init_names_the_field():
    @tc.autoinit
    class Tree(tc.TreeClass):
        guarded_value: float = tc.field(on_setattr=[_range_validator(0, 1)])

    with pytest.raises(ValueError, match=r"guarded_value.*value 2 is not in \[0, 1\]"):
        Tree(2)


def test_on_setattr_error_of_hand_written_init_names_the_field():
    class Tree(tc.TreeClass):
        guarded_value: float = tc.field(on_setattr=[_range_validator(0, 1)])

        def __init__(self, value):
            self.guarded_value = value

    with pytest.raises(ValueError, match=r"`Tree\.guarded_value`.*is not in \[0, 1\]"):
        Tree(-1)


def test_on_setattr_error_of_plain_autoinit_class_names_the_field():
    @tc.autoinit
    class Tree:
        guarded_value: float = tc.field(on_setattr=[float, _range_validator(0, 1)])

    with pytest.raises(ValueError, match=r"guarded_value.*could not convert"):
        Tree("high")


def test_on_setattr_assert_and_type_error_keep_their_type():
    def positive(value):
        assert value > 0
        return value

    @tc.autoinit
    class Tree(tc.TreeClass):
        a: int = tc.field(on_setattr=[positive])
        b: int = tc.field(default=1, on_setattr=[int])

    with pytest.raises(AssertionError, match="`Tree.a`"):
        Tree(-1)
    with pytest.raises(TypeError, match=r"`Tree\.b`.*int\(\) argument"):
        Tree(1, [])


def test_on_setattr_key_error_keeps_its_message_and_gets_a_note():
    def lookup(name):
        return {"relu": jax.nn.relu}[name]

    @tc.autoinit
    class Tree(tc.TreeClass):
        act: Any = tc.field(on_setattr=[lookup])

    with pytest.raises(KeyError) as info:
        Tree("gelu")
    assert info.value.args == ("gelu",)
    assert any("`Tree.act`" in note for note in getattr(info.value, "__notes__", []))


# -- 14.6: generated signatures carry annotations --------------------------------------------


def test_generated_init_signature_is_annotated():
    @tc.autoinit
    class Tree(tc.TreeClass):
        x: int
        y: int = 1

    # this module's annotations are strings (`from __future__ import annotations`)
    assert str(inspect.signature(Tree)) == "(x: 'int', y: 'int' = 1) -> None"
    assert str(inspect.signature(Tree, eval_str=True)) == "(x: int, y: int = 1) -> None"


def test_generated_init_signature_of_a_plain_autoinit_subclass():
    @tc.autoinit
    class Base:
        x: int

    @tc.autoinit
    class Derived(Base):
        y: int = tc.field(default=2, kind="KW_ONLY")

    signature = inspect.signature(Derived.__init__, eval_str=True)
    assert str(signature) == "(self, x: int, *, y: int = 2) -> None"


# -- 14.7: .set of a value that fits neither selection nor tree ------------------------------


def test_set_places_an_unfitting_value_whole_at_the_selection():
    assert tc.at({"a": 1, "b": 2})["a"].set((7, 8)) == {"a": (7, 8), "b": 2}
    assert Files().at["first"].set(("x", "y")).first == ("x", "y")


def test_set_places_a_value_whole_over_a_frozen_subtree():
    tree = {"a": tc.freeze(1), "b": 2}
    assert tc.at(tree)["a"].set((7, 8)) == {"a": (7, 8), "b": 2}


# -- 14.8: unsupported selectors and empty matches ------------------------------------------


@pytest.mark.parametrize("where", [None, 1.0, ["first", "second"], (("first",),), object()])
def test_unsupported_selector_raises_not_implemented_from_get_and_set(where):
    with pytest.raises(NotImplementedError, match="Unsupported selector"):
        Files().at[where].get()
    with pytest.raises(NotImplementedError, match="Unsupported selector"):
        Files().at[where].set("x")


def test_regex_matching_nothing_raises_lookup_error():
    with pytest.raises(LookupError, match="selects nothing"):
        Files().at[re.compile("w.*")].get()
    assert Files().at[re.compile("f.*|t.*")].set("-") == Files("-", "b.bin", "-")


# -- 14.9 (more): frozen values in arithmetic --------------------------------------------------


def test_operation_on_a_frozen_value_raises_not_implemented_and_type_error():
    frozen = tc.freeze(1)
    with pytest.raises(NotImplementedError, match="unfreeze"):
        frozen + 1
    with pytest.raises(TypeError):
        1 * frozen
    assert tc.unfreeze(frozen) + 1 == 2


# -- 14.10: printing hooks and repr(field) ---------------------------------------------------


def test_summary_and_graph_hooks_are_pytreeclass_spelled():
    class Token:
        pass

    try:
        tc.tree_summary.def_type(Token)(lambda token: "tok")
        tc.tree_summary.def_count(Token)(lambda token: 3)
        tc.tree_summary.def_size(Token)(lambda token: 12)
        tc.tree_graph.def_nodestyle(Token)(lambda token: {"shape": "circle"})
        summary = tc.tree_summary([Token()])
        assert "tok" in summary and "12B" in summary
        assert 'shape="circle"' in tc.tree_graph({"t": Token()})
    finally:
        tc.register_printer(Token)


def test_tree_str_prints_strings_bare_and_tree_repr_quotes_them():
    tree = {"name": "conv"}
    assert tc.tree_str(tree) == "{'name': conv}"
    assert tc.tree_repr(tree) == "{'name': 'conv'}"


def test_tree_diagram_shows_repr_false_fields_that_repr_hides():
    @tc.autoinit
    class Tree(tc.TreeClass):
        a: int = 1
        secret: int = tc.field(default=2, repr=False)

    assert repr(Tree()) == "Tree(a=1)"
    assert ".secret=2" in tc.tree_diagram(Tree())


def test_field_repr_shows_every_setting():
    def positive(x):
        return x

    text = repr(
        tc.field(
            default=1,
            kind="KW_ONLY",
            on_setattr=[float, positive],
            metadata={"unit": "m"},
            alias="one",
        )
    )
    assert text == (
        "Field(name=None, type=None, default=1, factory=None, init=True, repr=True, "
        "kind='KW_ONLY', alias='one', on_setattr=(float, positive), on_getattr=(), "
        "static=False, metadata={'unit': 'm'}, doc='')"
    )


def test_repr_of_a_class_field_names_it_and_its_annotation():
    @tc.autoinit
    class Tree(tc.TreeClass):
        a: int = tc.field(default=1)

    assert repr(tc.fields(Tree)[0]).startswith("Field(name='a', type='int', default=1, ")


# -- 14.4 (more): which annotations of plain bases are fields ---------------------------------


def test_autoinit_ignores_bare_annotations_of_an_undecorated_base():
    class Base:
        x: int  # what the base expects, not a parameter
        scale: float = tc.field(default=1.0, on_setattr=[float])

    @tc.autoinit
    class Derived(Base):
        y: int = 0

    assert list(inspect.signature(Derived).parameters) == ["scale", "y"]
    assert vars(Derived(2)) == {"scale": 2.0, "y": 0}


def test_autoinit_keeps_fields_of_decorated_bases_across_an_undecorated_one():
    @tc.autoinit
    class A:
        a: int

    class B(A):
        b: int

    @tc.autoinit
    class C(B):
        c: int

    assert list(inspect.signature(C).parameters) == ["a", "c"]
