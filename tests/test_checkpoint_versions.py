"""Versioned models: `version=` and `migrations=` class keywords, stamped by `tc.save` and
applied by `tc.load` to older files."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

import treeclass as tc


def _metadata(path) -> dict:
    with safe_open(str(path), "np") as file:
        return json.loads(file.metadata()["treeclass"])


def _rewrite(path, change) -> None:
    """Rewrite the treeclass metadata of a file (as an older treeclass would have written it)."""
    document = _metadata(path)
    change(document)
    tensors = load_file(str(path))
    save_file(tensors, str(path), metadata={"treeclass": json.dumps(document)})


def _abstract(build):
    return jax.eval_shape(build)


# -- declaring a version --------------------------------------------------------------------


def test_save_stamps_every_class_with_its_version(tmp_path):
    class Encoder(tc.TreeClass, version=3):
        w: jax.Array

    class Model(tc.TreeClass):
        encoder: Encoder
        head: jax.Array

    tc.save(tmp_path / "m.safetensors", Model(Encoder(jnp.ones(2)), jnp.ones(1)))
    assert _metadata(tmp_path / "m.safetensors")["versions"] == {
        "Model": {"version": 0, "at": [""]},
        "Encoder": {"version": 3, "at": ["encoder"]},
    }


def test_the_version_is_no_field_and_does_not_change_the_tree():
    class Plain(tc.TreeClass):
        w: jax.Array

    class Versioned(tc.TreeClass, version=2, migrations={1: {"weight": "w"}}):
        w: jax.Array

    plain, versioned = Plain(jnp.ones(2)), Versioned(jnp.ones(2))
    assert [f.name for f in tc.fields(Versioned)] == ["w"]
    assert list(vars(versioned)) == list(vars(plain)) and not hasattr(versioned, "version")
    assert jax.tree_util.tree_structure(versioned).num_leaves == 1
    assert jax.tree_util.tree_leaves(versioned)[0] is versioned.w


def test_a_subclass_inherits_its_bases_version_unless_it_declares_one(tmp_path):
    class Base(tc.TreeClass, version=2):
        w: jax.Array

    class Child(Base):
        pass

    class Own(Base, version=5):
        pass

    tc.save(tmp_path / "m.safetensors", {"a": Child(jnp.ones(1)), "b": Own(jnp.ones(1))})
    versions = _metadata(tmp_path / "m.safetensors")["versions"]
    assert versions == {"Child": {"version": 2, "at": ["a"]}, "Own": {"version": 5, "at": ["b"]}}


@pytest.mark.parametrize(
    "keywords, error, match",
    [
        ({"version": -1}, TypeError, "version= takes its checkpoint version, an int >= 0"),
        ({"version": "2"}, TypeError, "got '2'"),
        ({"version": True}, TypeError, "got True"),
        ({"migrations": {0: {"a": "b"}}}, TypeError, "migrations= needs version="),
        ({"version": 2, "migrations": {2: {"a": "b"}}}, ValueError, "got the key 2"),
        ({"version": 2, "migrations": [{"a": "b"}]}, TypeError, "got a list"),
        ({"version": 2, "migrations": {1: [("a",)]}}, TypeError, "from version 1 to 2"),
    ],
)
def test_a_bad_declaration_is_an_error_naming_the_class(keywords, error, match):
    with pytest.raises(error, match=match) as info:

        class Broken(tc.TreeClass, **keywords):
            w: jax.Array

    assert "class Broken" in str(info.value)


# -- migrating ----------------------------------------------------------------------------


def test_renames_run_in_order_from_the_files_version_to_the_classs(tmp_path):
    path = tmp_path / "m.safetensors"

    class Linear(tc.TreeClass, version=1):
        w: jax.Array

    tc.save(path, Linear(jnp.arange(3.0)))

    class Linear(tc.TreeClass, version=3, migrations={1: {"w": "kernel"}, 2: {"kernel": "weight"}}):
        weight: jax.Array

    template = Linear(jnp.zeros(3))
    restored = tc.load(path, template)
    assert restored.weight.tolist() == [0.0, 1.0, 2.0]
    _, report = tc.load(path, template, strict=False)
    assert report.migrations == (
        "Linear 1 -> 2 (rules) at the root",
        "Linear 2 -> 3 (rules) at the root",
    )
    assert report.sources == {"Linear.weight": ("w",)}


def test_a_file_at_an_intermediate_version_runs_only_the_later_steps(tmp_path):
    path = tmp_path / "m.safetensors"

    class Linear(tc.TreeClass, version=2):
        kernel: jax.Array

    tc.save(path, Linear(jnp.ones(2)))

    class Linear(tc.TreeClass, version=3, migrations={1: {"w": "kernel"}, 2: {"kernel": "weight"}}):
        weight: jax.Array

    restored, report = tc.load(path, Linear(jnp.zeros(2)), strict=False)
    assert report.migrations == ("Linear 2 -> 3 (rules) at the root",)
    assert restored.weight.tolist() == [1.0, 1.0]


def test_a_file_of_the_current_version_runs_no_migration(tmp_path):
    class Linear(tc.TreeClass, version=2, migrations={1: {"w": "weight"}}):
        weight: jax.Array

    tc.save(tmp_path / "m.safetensors", Linear(jnp.ones(2)))
    _, report = tc.load(tmp_path / "m.safetensors", Linear(jnp.zeros(2)), strict=False)
    assert report.migrations == () and report.messages == ()


def split_qkv(arrays):
    """Version 1 kept q, k and v in one fused tensor; version 2 keeps three."""
    rest = {name: value for name, value in arrays.items() if name != "qkv"}
    q, k, v = jnp.split(arrays["qkv"], 3)
    return {**rest, "q": q, "k": k, "v": v}


def test_a_function_step_splits_one_tensor_into_several(tmp_path):
    path = tmp_path / "m.safetensors"

    class Attention(tc.TreeClass, version=1):
        qkv: jax.Array
        scale: float

    fused = jnp.arange(24.0).reshape(6, 4)
    tc.save(path, Attention(fused, 0.5))

    class Attention(tc.TreeClass, version=2, migrations={1: split_qkv}):
        q: jax.Array
        k: jax.Array
        v: jax.Array
        scale: float

    template = _abstract(lambda: Attention(*(jnp.zeros((2, 4)),) * 3, 1.0))
    restored = tc.load(path, template)
    np.testing.assert_array_equal(restored.k, fused[2:4])
    assert restored.scale == 0.5
    report = tc.load(path, template, dry_run=True)
    assert report.migrations == ("Attention 1 -> 2 (split_qkv) at the root",)
    assert report.sources["Attention.v"] == ("qkv",)


def test_a_function_step_merges_and_reshapes(tmp_path):
    path = tmp_path / "m.safetensors"

    class Dense(tc.TreeClass, version=0):
        w_left: jax.Array
        w_right: jax.Array
        b: jax.Array

    tc.save(path, Dense(jnp.ones((2, 3)), jnp.zeros((2, 1)), jnp.arange(4.0)))

    def merge(arrays):
        return {
            "w": jnp.concatenate([arrays["w_left"], arrays["w_right"]], axis=1),
            "b": arrays["b"].reshape(2, 2),
        }

    class Dense(tc.TreeClass, version=1, migrations={0: merge}):
        w: jax.Array
        b: jax.Array

    restored = tc.load(path, Dense(jnp.zeros((2, 4)), jnp.zeros((2, 2))))
    assert restored.w.tolist() == [[1, 1, 1, 0], [1, 1, 1, 0]]
    assert restored.b.tolist() == [[0, 1], [2, 3]]
    _, report = tc.load(path, Dense(jnp.zeros((2, 4)), jnp.zeros((2, 2))), strict=False)
    assert report.sources["Dense.w"] == ("w_left", "w_right")


def test_nested_classes_migrate_under_their_own_key_paths(tmp_path):
    path = tmp_path / "m.safetensors"

    class Block(tc.TreeClass):
        w: jax.Array

    class Model(tc.TreeClass):
        layers: list
        head: jax.Array

    tc.save(path, Model([Block(jnp.full(2, float(i))) for i in range(3)], jnp.ones(1)))

    class Block(tc.TreeClass, version=1, migrations={0: {"w": "weight"}}):
        weight: jax.Array

    class Model(tc.TreeClass, version=1, migrations={0: {"layers.{rest*}": "blocks.{rest}"}}):
        blocks: list
        head: jax.Array

    template = Model([Block(jnp.zeros(2)) for _ in range(3)], jnp.zeros(1))
    restored, report = tc.load(path, template, strict=False)
    assert [b.weight.tolist() for b in restored.blocks] == [[0, 0], [1, 1], [2, 2]]
    assert report.messages == ()
    # each block renames its own field where the file has it, then the outer class moves
    # its fields
    assert report.migrations == (
        "Block 0 -> 1 (rules) at layers.0, layers.1, layers.2",
        "Model 0 -> 1 (rules) at the root",
    )
    assert report.sources["Model.blocks[2].weight"] == ("layers.2.w",)


def test_each_class_migrates_from_its_own_saved_version(tmp_path):
    path = tmp_path / "m.safetensors"

    class Encoder(tc.TreeClass, version=1):
        weight: jax.Array

    class Model(tc.TreeClass, version=0):
        enc: Encoder

    tc.save(path, Model(Encoder(jnp.ones(2))))

    # Encoder's first step already ran in the saved file; Model's has not
    class Encoder(
        tc.TreeClass, version=2, migrations={0: {"w": "weight"}, 1: {"weight": "kernel"}}
    ):
        kernel: jax.Array

    class Model(tc.TreeClass, version=1, migrations={0: {"enc.{rest*}": "encoder.{rest}"}}):
        encoder: Encoder

    restored, report = tc.load(path, Model(Encoder(jnp.zeros(2))), strict=False)
    assert restored.encoder.kernel.tolist() == [1.0, 1.0]
    assert report.migrations == (
        "Encoder 1 -> 2 (rules) at enc",
        "Model 0 -> 1 (rules) at the root",
    )


def test_a_newer_file_is_an_error_naming_the_class_and_both_versions(tmp_path):
    path = tmp_path / "m.safetensors"

    class Encoder(tc.TreeClass, version=4):
        w: jax.Array

    tc.save(path, {"encoder": Encoder(jnp.ones(2))})

    class Encoder(tc.TreeClass, version=3):
        w: jax.Array

    for strict in (True, False):
        with pytest.raises(
            ValueError, match=r"`Encoder` saved at checkpoint version 4.*\(version 3\)"
        ):
            tc.load(path, {"encoder": Encoder(jnp.zeros(2))}, strict=strict)
    with pytest.raises(ValueError, match="version 4"):
        tc.load(path, {"encoder": Encoder(jnp.zeros(2))}, dry_run=True)


def test_a_file_without_stamps_holds_version_zero_of_every_class(tmp_path):
    path = tmp_path / "m.safetensors"

    class Linear(tc.TreeClass):
        w: jax.Array

    tc.save(path, Linear(jnp.ones(2)))
    _rewrite(path, lambda document: document.pop("versions"))  # as treeclass wrote it before

    class Linear(tc.TreeClass, version=1, migrations={0: {"w": "weight"}}):
        weight: jax.Array

    restored, report = tc.load(path, Linear(jnp.zeros(2)), strict=False)
    assert restored.weight.tolist() == [1.0, 1.0]
    assert report.migrations == ("Linear 0 -> 1 (rules) at the root",)


def test_a_file_of_another_tool_is_unversioned_and_takes_the_users_rules(tmp_path):
    path = str(tmp_path / "m.safetensors")
    save_file({"fc.weight": np.ones((3, 2), np.float32)}, path)

    class Linear(tc.TreeClass, version=1, migrations={0: {"w": "weight"}}):
        weight: jax.Array

    template = Linear(jnp.zeros((2, 3)))
    restored, report = tc.load(
        path, template, rules=[("fc.weight", "weight", lambda w: w.T)], strict=False
    )
    assert report.migrations == () and report.messages == ()
    assert restored.weight.shape == (2, 3)


def test_a_class_the_saved_tree_did_not_hold_is_not_migrated(tmp_path):
    path = tmp_path / "m.safetensors"

    class Model(tc.TreeClass, version=0):
        weight: jax.Array

    tc.save(path, Model(jnp.ones(2)))

    class Head(tc.TreeClass, version=1, migrations={0: {"weight": "never"}}):
        weight: jax.Array

    class Model(tc.TreeClass, version=1, migrations={0: {"weight": "head.weight"}}):
        head: Head

    restored, report = tc.load(path, Model(Head(jnp.zeros(2))), strict=False)
    assert report.migrations == ("Model 0 -> 1 (rules) at the root",)
    assert restored.head.weight.tolist() == [1.0, 1.0]


def test_the_users_rules_see_the_migrated_names(tmp_path):
    path = tmp_path / "m.safetensors"

    class Linear(tc.TreeClass):
        w: jax.Array

    tc.save(path, {"body": Linear(jnp.ones(2))})

    class Linear(tc.TreeClass, version=1, migrations={0: {"w": "weight"}}):
        weight: jax.Array

    rules = [("body.weight", "encoder.weight", lambda w: w * 2)]
    restored, report = tc.load(path, {"encoder": Linear(jnp.zeros(2))}, rules=rules, strict=False)
    assert restored["encoder"].weight.tolist() == [2.0, 2.0]
    assert report.sources == {"tree['encoder'].weight": ("body.w",)}
    assert report.migrations == ("Linear 0 -> 1 (rules) at body",)


def test_a_strict_load_lists_what_the_migrations_left_unmatched(tmp_path):
    path = tmp_path / "m.safetensors"

    class Linear(tc.TreeClass):
        w: jax.Array
        b: jax.Array

    tc.save(path, Linear(jnp.ones(2), jnp.ones(2)))

    class Linear(tc.TreeClass, version=1, migrations={0: {"w": "weight"}}):
        weight: jax.Array
        bias: jax.Array

    template = Linear(jnp.zeros(2), jnp.zeros(2))
    with pytest.raises(ValueError) as info:
        tc.load(path, template)
    assert "missing     Linear.bias: no 'bias' in the file" in str(info.value)
    assert "unexpected  'b'" in str(info.value)
    with pytest.warns(UserWarning, match=r"rules=\[\('b', 'bias'\)\]"):  # the one f32[2] each
        restored, report = tc.load(path, template, strict=False)
    assert report.missing == ("Linear.bias",) and report.unexpected == ("b",)
    assert report.restored == ("Linear.weight",) and restored.weight.tolist() == [1.0, 1.0]
    assert report.migrations == ("Linear 0 -> 1 (rules) at the root",)


def test_a_dry_run_of_a_migration_reads_no_tensor_bytes(tmp_path):
    path = tmp_path / "m.safetensors"

    class Gate(tc.TreeClass):
        flags: jax.Array
        fused: jax.Array

    tc.save(path, Gate(jnp.array([True, False]), jnp.ones((4, 2))))
    raw = bytearray(path.read_bytes())
    offset = raw.index(b"\x01\x00", 8 + int.from_bytes(raw[:8], "little"))
    raw[offset] = 7  # a bool byte no reader may accept: only reading the data finds it
    path.write_bytes(bytes(raw))

    def halves(arrays):
        top, bottom = jnp.split(arrays["fused"], 2)
        return {"mask": arrays["flags"], "top": top, "bottom": bottom}

    class Gate(tc.TreeClass, version=1, migrations={0: halves}):
        mask: jax.Array
        top: jax.Array
        bottom: jax.Array

    template = _abstract(lambda: Gate(jnp.zeros(2, bool), jnp.zeros((2, 2)), jnp.zeros((2, 2))))
    report = tc.load(path, template, dry_run=True)
    assert report.messages == () and report.sources["Gate.mask"] == ("flags",)
    # the split reads only the tensor it is computed from: the renamed one is not read
    tops = tc.load(path, template, where=template.at["top"], strict=False)[0]
    assert tops.top.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    with pytest.raises(ValueError, match="0 or 1"):
        tc.load(path, template)


def test_a_failing_function_step_is_an_error_naming_the_step_and_the_class(tmp_path):
    path = tmp_path / "m.safetensors"

    class Block(tc.TreeClass):
        w: jax.Array

    tc.save(path, {"blocks": [Block(jnp.ones(2))]})

    def rename_kernel(arrays):
        return {"weight": arrays["kernel"]}

    class Block(tc.TreeClass, version=1, migrations={0: rename_kernel}):
        weight: jax.Array

    for dry_run in (False, True):
        with pytest.raises(ValueError) as info:
            tc.load(path, {"blocks": [Block(jnp.zeros(2))]}, dry_run=dry_run)
        message = str(info.value)
        assert "m.safetensors" in message and "KeyError: 'kernel'" in message
        assert "migration of `Block` from version 0 to 1 (rename_kernel) at blocks.0" in message


def test_a_function_step_returning_something_else_is_an_error_naming_it(tmp_path):
    path = tmp_path / "m.safetensors"

    class Block(tc.TreeClass):
        w: jax.Array

    tc.save(path, Block(jnp.ones(2)))

    class Block(tc.TreeClass, version=1, migrations={0: lambda arrays: [arrays["w"]]}):
        w: jax.Array

    with pytest.raises(
        ValueError, match=r"`Block` from version 0 to 1 \(<lambda>\).*returned a list"
    ):
        tc.load(path, Block(jnp.zeros(2)))


@pytest.mark.parametrize("key", [3, None, ("w",), b"w"])
def test_a_function_step_returning_a_key_that_is_no_string_names_the_key(tmp_path, key):
    path = tmp_path / "m.safetensors"

    class Block(tc.TreeClass):
        w: jax.Array

    tc.save(path, Block(jnp.ones(2)))

    class Block(tc.TreeClass, version=1, migrations={0: lambda arrays: {key: arrays["w"]}}):
        w: jax.Array

    with pytest.raises(ValueError) as info:
        tc.load(path, Block(jnp.zeros(2)))
    message = str(info.value)
    assert f"returned the key {key!r} (a {type(key).__name__})" in message
    assert "`Block` from version 0 to 1" in message and "m.safetensors" in message


@pytest.mark.parametrize(
    "version, steps, missing",
    [(3, (0, 2), "1 to 2"), (3, (0,), "1 to 2, 2 to 3"), (5, (1, 2, 4), "3 to 4")],
)
def test_a_hole_in_the_migrations_is_refused_at_class_definition(version, steps, missing):
    with pytest.raises(ValueError, match=f"none from version {missing}:") as info:

        class Gappy(tc.TreeClass, version=version, migrations=dict.fromkeys(steps, {})):
            w: jax.Array

    assert "class Gappy" in str(info.value)


def test_a_version_that_renamed_nothing_takes_an_empty_rule_table(tmp_path):
    path = tmp_path / "m.safetensors"

    class Linear(tc.TreeClass):
        w: jax.Array

    tc.save(path, Linear(jnp.ones(2)))

    class Linear(tc.TreeClass, version=3, migrations={0: {"w": "k"}, 1: {}, 2: {"k": "weight"}}):
        weight: jax.Array

    assert tc.load(path, Linear(jnp.zeros(2))).weight.tolist() == [1.0, 1.0]


def test_a_failing_rule_transform_names_the_step_and_the_class(tmp_path):
    path = tmp_path / "m.safetensors"

    class Block(tc.TreeClass):
        w: jax.Array

    tc.save(path, Block(jnp.ones(2)))

    class Block(tc.TreeClass, version=1, migrations={0: [("w", "w", lambda w: w.no_such())]}):
        w: jax.Array

    with pytest.raises(ValueError) as info:
        tc.load(path, Block(jnp.zeros(2)))
    assert "AttributeError" in str(info.value)
    assert "migration of `Block` from version 0 to 1 (rules) at the root" in str(info.value)


def test_a_function_step_renames_values_that_are_not_arrays(tmp_path):
    path = tmp_path / "m.safetensors"

    class Layer(tc.TreeClass):
        def __init__(self):
            self.w = jnp.ones(2)
            self.act = tc.freeze(jax.nn.relu)
            self.tag = "old"
            self.steps = 3

    tc.save(path, Layer())

    def rename(arrays):
        names = {"w": "weight", "act": "activation", "tag": "label", "steps": "steps"}
        return {names[name]: value for name, value in arrays.items()}

    class Layer(tc.TreeClass, version=1, migrations={0: rename}):
        def __init__(self):
            self.weight = jnp.zeros(2)
            self.activation = tc.freeze(jax.nn.relu)
            self.label = "new"
            self.steps = 0

    restored = tc.load(path, Layer())
    assert restored.label == "old" and restored.steps == 3
    assert restored.weight.tolist() == [1.0, 1.0]


def test_a_version_without_a_step_changes_no_names(tmp_path):
    path = tmp_path / "m.safetensors"

    class Linear(tc.TreeClass, version=1):
        w: jax.Array

    tc.save(path, Linear(jnp.ones(2)))

    class Linear(tc.TreeClass, version=3, migrations={2: {"w": "weight"}}):
        weight: jax.Array

    restored, report = tc.load(path, Linear(jnp.zeros(2)), strict=False)
    assert report.migrations == ("Linear 2 -> 3 (rules) at the root",)
    assert restored.weight.tolist() == [1.0, 1.0]


def test_two_classes_of_one_name_with_different_versions_cannot_be_saved(tmp_path):
    def make(version):
        class Block(tc.TreeClass, version=version):
            w: jax.Array

        return Block(jnp.ones(1))

    with pytest.raises(ValueError, match="two classes named Block"):
        tc.save(tmp_path / "m.safetensors", [make(1), make(2)])
    assert not (tmp_path / "m.safetensors").exists()


def test_malformed_version_stamps_are_a_corrupt_file(tmp_path):
    path = tmp_path / "m.safetensors"

    class Linear(tc.TreeClass):
        w: jax.Array

    tc.save(path, Linear(jnp.ones(2)))
    _rewrite(path, lambda document: document.update(versions={"Linear": -1}))
    with pytest.raises(ValueError, match="class versions of its treeclass metadata are malformed"):
        tc.load(path, Linear(jnp.zeros(2)))


@pytest.mark.parametrize(
    "step, b",
    [
        (lambda names: {"ab": names["a"].reshape(1, 2), "b": names["b"]}, [0, 1, 2]),
        (lambda names: {"ab": jnp.reshape(names["a"], (1, 2)), "b": names["b"] + 1}, [1, 2, 3]),
    ],
)
def test_a_function_step_keeps_the_files_64_bit_dtypes(tmp_path, step, b):
    path = tmp_path / "m.safetensors"

    class Pair(tc.TreeClass, version=1):
        a: np.ndarray
        b: np.ndarray

    tc.save(path, Pair(np.array([1.5, 2.5]), np.arange(3)))

    class Pair(tc.TreeClass, version=2, migrations={1: step}):
        ab: np.ndarray
        b: np.ndarray

    template = Pair(np.zeros((1, 2)), np.zeros(3, np.int64))
    assert tc.load(path, template, dry_run=True).mismatched == ()
    restored = tc.load(path, template)
    assert restored.ab.dtype == np.float64 and restored.ab.tolist() == [[1.5, 2.5]]
    assert restored.b.dtype == np.int64 and restored.b.tolist() == b


def test_a_function_step_on_32_bit_tensors_keeps_jaxs_default_dtypes(tmp_path):
    path = tmp_path / "m.safetensors"

    class Linear(tc.TreeClass, version=1):
        w: jax.Array

    tc.save(path, Linear(jnp.ones(2)))

    class Linear(tc.TreeClass, version=2, migrations={1: lambda n: {**n, "b": jnp.zeros(2)}}):
        w: jax.Array
        b: jax.Array

    restored = tc.load(path, Linear(jnp.zeros(2), jnp.ones(2)))
    assert restored.b.dtype == jnp.float32 and restored.b.tolist() == [0.0, 0.0]
