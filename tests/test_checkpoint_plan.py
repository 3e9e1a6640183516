"""Key rules both ways: the plan export writes by is the plan load reads by.

The laws, over generated rule tables (renames, transposes, splits, concatenations, tied
weights, dtype casts alone or after a transpose with their inverses, per-layer names for an
unrolled, a stacked and a periodic model): `export(load(file)) == file` (names, dtypes,
bytes; the metadata in every shard's header) and `load(export(model)) == model`.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

import treeclass as tc

WIDTH, VOCAB = 4, 6


class Block(tc.TreeClass):
    q: Any
    k: Any
    ln: Any


class Net(tc.TreeClass):
    embed: Any
    head: Any
    layers: Any


def _block() -> Block:
    return Block(jnp.zeros((WIDTH, WIDTH)), jnp.zeros((WIDTH, WIDTH)), jnp.zeros(WIDTH))


def _templates(depth: int) -> dict[str, Net]:
    """The same model unrolled, stacked and periodic (a pattern of two layers)."""
    blocks = [_block() for _ in range(depth)]
    make = lambda layers: Net(jnp.zeros((VOCAB, WIDTH)), jnp.zeros((WIDTH, VOCAB)), layers)  # noqa: E731
    return {
        "unrolled": make(blocks),
        "stacked": make(tc.Stacked.from_blocks(blocks)),
        "periodic": make(tc.Periodic.from_layers(blocks, 2)),
    }


def _table(q: str, k: str, ln: str, tied: bool) -> tuple[list[tuple], dict[str, tuple]]:
    """A rule table for `Net`, and the file's names (dtype, shape per layer `{i}`)."""
    layer = "model.layers.{i}"
    rules: list[tuple] = []
    names: dict[str, tuple] = {}
    f32 = np.dtype(np.float32)
    if q == "fused" or k == "fused":  # q and k split from one fused tensor
        rules.append(
            (f"{layer}.attn.qk", ["layers[{i}].q", "layers[{i}].k"], lambda w: jnp.split(w, 2))
        )
        names[f"{layer}.attn.qk"] = (f32, (2 * WIDTH, WIDTH))
    for field, kind in (("q", q), ("k", k)) if "fused" not in (q, k) else ():
        source = f"{layer}.attn.{field}_proj"
        if kind == "rename":
            rules.append((source, f"layers[{{i}}].{field}"))
            names[source] = (f32, (WIDTH, WIDTH))
        elif kind == "transpose":
            rules.append((source, f"layers[{{i}}].{field}", lambda w: w.T))
            names[source] = (f32, (WIDTH, WIDTH))
        elif kind == "transpose+cast":  # bfloat16 [in, out] in the file: both directions given
            load = lambda w: w.T.astype(jnp.float32)  # noqa: E731
            back = lambda w: w.T.astype(jnp.bfloat16)  # noqa: E731
            rules.append((source, f"layers[{{i}}].{field}", load, back))
            names[source] = (np.dtype(jnp.bfloat16), (WIDTH, WIDTH))
        elif kind == "halves":  # one model array from two file tensors
            parts = [f"{source}.a", f"{source}.b"]
            join = lambda a, b: jnp.concatenate([a, b])  # noqa: E731
            rules.append((parts, f"layers[{{i}}].{field}", join))
            names.update({p: (f32, (WIDTH // 2, WIDTH)) for p in parts})
    if ln == "cast":  # bfloat16 in the file, float32 in the model: both directions given
        cast = lambda w: w.astype(jnp.float32)  # noqa: E731
        back = lambda w: w.astype(jnp.bfloat16)  # noqa: E731
        rules.append((f"{layer}.norm.{{n:weight}}", "layers[{i}].ln", cast, back))
        names[f"{layer}.norm.weight"] = (np.dtype(jnp.bfloat16), (WIDTH,))
    else:  # the per-layer catch-all, limited to what the other rules leave
        rules.append((f"{layer}.{{rest:ln}}", "layers[{i}].{rest}"))
        names[f"{layer}.ln"] = (f32, (WIDTH,))
    if tied:
        rules.append(("model.embed", ["embed", "head"], lambda w: (w, w.T)))
        names["model.embed"] = (f32, (VOCAB, WIDTH))
    else:
        rules += [("model.embed", "embed"), ("lm_head", "head", lambda w: w.T)]
        names.update({"model.embed": (f32, (VOCAB, WIDTH)), "lm_head": (f32, (VOCAB, WIDTH))})
    return rules, names


def _file(names: dict[str, tuple], depth: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for pattern, (dtype, shape) in names.items():
        for i in range(depth if "{i}" in pattern else 1):
            out[pattern.replace("{i}", str(i))] = rng.normal(size=shape).astype(dtype)
    return out


def _same_file(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for name, array in want.items():
        assert (got[name].dtype, got[name].shape) == (array.dtype, array.shape), name
        assert got[name].tobytes() == array.tobytes(), name


TABLES = st.tuples(
    st.sampled_from(["rename", "transpose", "transpose+cast", "fused", "halves"]),
    st.sampled_from(["rename", "transpose", "transpose+cast", "fused"]),
    st.sampled_from(["cast", "catch-all"]),
    st.booleans(),
)


@settings(max_examples=12, deadline=None)
@given(table=TABLES, depth=st.sampled_from([2, 4]), seed=st.integers(0, 2**16))
def test_export_of_a_load_is_the_file_and_load_of_an_export_is_the_model(table, depth, seed):
    rules, names = _table(*table)
    file = _file(names, depth, seed)
    exports = {}
    for layout, template in _templates(depth).items():
        model = tc.from_state_dict(template, file, rules=rules)
        exported = tc.state_dict(model, rules=rules)
        _same_file(exported, file)
        assert tc.is_tree_equal(tc.from_state_dict(template, exported, rules=rules), model)
        exports[layout] = exported
    # an unrolled, a stacked and a periodic model of the same weights write one file
    for exported in exports.values():
        _same_file(exported, exports["unrolled"])


@settings(max_examples=4, deadline=None)
@given(table=TABLES, seed=st.integers(0, 2**16))
def test_a_sharded_export_is_the_file_with_its_metadata_in_every_shard(table, seed):
    rules, names = _table(*table)
    file = _file(names, 2, seed)
    model = tc.from_state_dict(_templates(2)["stacked"], file, rules=rules)
    with tempfile.TemporaryDirectory() as folder:
        index = Path(folder) / "model.safetensors.index.json"
        tc.save(index, model, rules=rules, max_shard_size="300B", metadata={"format": "pt"})
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        assert len(shards) > 1
        written = {}
        for shard in shards:
            with safe_open(str(Path(folder) / shard), "np") as f:
                assert f.metadata()["format"] == "pt"
            written.update(load_file(str(Path(folder) / shard)))
        _same_file(written, file)
        assert json.loads(index.read_text())["metadata"]["format"] == "pt"
        assert tc.is_tree_equal(tc.load(index, _templates(2)["stacked"], rules=rules), model)


# -- the cases that went wrong silently ----------------------------------------------------------


def _ln_net(depth: int = 3) -> dict:
    class Layer(tc.TreeClass):
        ln: dict
        w: Any

    layers = [Layer({"weight": jnp.full(2, float(i))}, jnp.full((2, 2), i + 0.5)) for i in range(3)]
    return {"layers": tc.Stacked.from_blocks(layers[:depth])}


CATCH_ALL = [("layers.{i}.{rest*}", "layers[{i}].{rest}")]


def test_a_catch_all_per_layer_rule_exports_each_layer_of_a_stack_by_its_index(tmp_path):
    model = _ln_net()
    out = tc.state_dict(model, rules=CATCH_ALL)
    assert list(out) == [f"layers.{i}.{n}" for i in range(3) for n in ("ln.weight", "w")]
    assert out["layers.2.ln.weight"].tolist() == [2.0, 2.0]
    tc.save(tmp_path / "m.safetensors", model, rules=CATCH_ALL)
    assert tc.is_tree_equal(tc.load(tmp_path / "m.safetensors", model, rules=CATCH_ALL), model)


def test_a_stack_under_one_name_is_refused_where_the_rule_reads_it_per_layer(tmp_path):
    tensors = {"layers.ln.weight": np.ones((3, 2), np.float32)}
    tensors.update({f"layers.{i}.w": np.ones((2, 2), np.float32) for i in range(3)})
    save_file(tensors, str(tmp_path / "m.safetensors"))
    with pytest.raises(ValueError, match="1 problem") as info:
        tc.load(tmp_path / "m.safetensors", _ln_net(), rules=CATCH_ALL)
    message = str(info.value)
    assert "key rule 'layers.{i}.{rest*}' -> 'layers.{i}.{rest}' reads ['layers.ln.weight']" in (
        message
    )
    assert "names that stack's layers ('layers.0.ln.weight', ...)" in message


def test_a_rule_naming_the_stacked_leaf_itself_still_reads_and_writes_it_whole(tmp_path):
    model = _ln_net()
    rules = [("ln_stack", "layers.ln.weight"), *CATCH_ALL]
    out = tc.state_dict(model, rules=rules)
    assert out["ln_stack"].shape == (3, 2) and "layers.0.w" in out
    tc.save(tmp_path / "m.safetensors", model, rules=rules)
    assert tc.is_tree_equal(tc.load(tmp_path / "m.safetensors", model, rules=rules), model)


def test_a_target_of_a_several_segment_capture_exports_under_the_source_name():
    model = {"a": {"w": jnp.arange(4.0)}}
    assert list(tc.state_dict(model, rules=[("pre.{rest*}", "{rest}")])) == ["pre.a.w"]
    halve = ("{rest*}", "{rest}", lambda w: w * 2, lambda w: w / 2)
    assert tc.state_dict(model, rules=[halve])["a.w"].tolist() == [0.0, 0.5, 1.0, 1.5]


def test_a_one_way_transform_of_a_several_segment_capture_is_refused_before_export(tmp_path):
    model = {"a": {"w": jnp.arange(4.0)}}
    path = tmp_path / "m.safetensors"
    for transform in (lambda w: w * 2, lambda w: w.astype(jnp.float32)):
        with pytest.raises(ValueError, match=r"key rule 'pre.\{rest\*\}' -> '\{rest\}' cannot be"):
            tc.save(path, model, rules=[("pre.{rest*}", "{rest}", transform)])
        assert not path.exists()


def test_a_bfloat16_file_cast_on_load_exports_bfloat16_through_the_inverse(tmp_path):
    w = np.arange(4, dtype=np.float32).astype(jnp.bfloat16)
    save_file({"pre.a.w": w}, str(tmp_path / "in.safetensors"))
    rule = ("pre.{rest*}", "{rest}", lambda w: w.astype(jnp.float32))
    model = tc.load(tmp_path / "in.safetensors", {"a": {"w": jnp.zeros(4)}}, rules=[rule])
    with pytest.raises(ValueError, match="cannot be inverted"):
        tc.save(tmp_path / "out.safetensors", model, rules=[rule])
    both = (*rule, lambda w: w.astype(jnp.bfloat16))
    tc.save(tmp_path / "out.safetensors", model, rules=[both])
    _same_file(load_file(str(tmp_path / "out.safetensors")), {"pre.a.w": w})


def test_a_target_that_does_not_capture_what_its_source_does_cannot_run_backwards():
    with pytest.raises(ValueError, match=r"does not capture \['j'\], which its sources use"):
        tc.state_dict({"b": {"x": jnp.ones(2)}}, rules=[("a.{i}.{j}", "b.{i}")])


def test_every_law_table_fails_on_a_changed_byte():
    rules, names = _table("transpose", "rename", "cast", True)
    file = _file(names, 2, 0)
    model = tc.from_state_dict(_templates(2)["stacked"], file, rules=rules)
    changed = model.at["layers"][1]["q"].apply(lambda q: q.at[0, 0].add(1.0))
    with pytest.raises(AssertionError):
        _same_file(tc.state_dict(changed, rules=rules), file)


def test_a_tensor_split_on_load_is_joined_again_on_export():
    rules, names = _table("fused", "fused", "catch-all", False)
    file = _file(names, 2, 1)
    model = tc.from_state_dict(_templates(2)["unrolled"], file, rules=rules)
    out = tc.state_dict(model, rules=rules)
    q, k = np.split(file["model.layers.1.attn.qk"], 2)
    assert np.array_equal(np.asarray(model.layers[1].q), q)
    assert np.array_equal(np.asarray(model.layers[1].k), k)
    assert out["model.layers.1.attn.qk"].tobytes() == file["model.layers.1.attn.qk"].tobytes()
