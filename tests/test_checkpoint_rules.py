"""Loading weights from elsewhere: key rules, dry runs and partial loads.

The fixtures are written by the real writer (`safetensors.numpy.save_file`) with
GPT-2-style names and PyTorch's `[out, in]` weight layout; a small GPT-2-like TreeClass
loads them through a rule table and must give the logits of a NumPy reference forward.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file

import treeclass as tc

# references are compared at tight tolerances: full-precision matrix products everywhere
pytestmark = pytest.mark.usefixtures("highest_precision")

# a non-strict load that kept values the file holds under another name warns; expected
LOSSY = pytest.mark.filterwarnings("ignore:.*under another name, dtype or layout:UserWarning")

WIDTH, VOCAB, LAYERS, CONTEXT = 8, 11, 2, 5


def gpt2_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    """GPT-2's names; `c_attn` fused q, k, v along its output axis; `c_proj`/`c_fc` as
    PyTorch `nn.Linear` stores them, `[out, in]`."""
    rng = np.random.default_rng(seed)
    normal = lambda *shape: rng.normal(size=shape).astype(np.float32) * 0.3  # noqa: E731
    tensors = {"wte.weight": normal(VOCAB, WIDTH), "wpe.weight": normal(CONTEXT, WIDTH)}
    for i in range(LAYERS):
        tensors[f"h.{i}.attn.c_attn.weight"] = normal(3 * WIDTH, WIDTH)
        tensors[f"h.{i}.attn.c_attn.bias"] = normal(3 * WIDTH)
        tensors[f"h.{i}.attn.c_proj.weight"] = normal(WIDTH, WIDTH)
        tensors[f"h.{i}.mlp.c_fc.weight"] = normal(4 * WIDTH, WIDTH)
        tensors[f"h.{i}.mlp.c_proj.weight"] = normal(WIDTH, 4 * WIDTH)
    return tensors


def reference_logits(t: dict[str, np.ndarray], tokens: np.ndarray) -> np.ndarray:
    """The forward pass in NumPy, on the file's own names and layouts."""
    x = t["wte.weight"][tokens] + t["wpe.weight"][: len(tokens)]
    mask = np.tril(np.ones((len(tokens), len(tokens)), bool))
    for i in range(LAYERS):
        qkv = x @ t[f"h.{i}.attn.c_attn.weight"].T + t[f"h.{i}.attn.c_attn.bias"]
        q, k, v = np.split(qkv, 3, axis=-1)
        scores = np.where(mask, q @ k.T / np.sqrt(WIDTH), -np.inf)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        x = x + (weights @ v) @ t[f"h.{i}.attn.c_proj.weight"].T
        x = x + np.maximum(x @ t[f"h.{i}.mlp.c_fc.weight"].T, 0) @ t[f"h.{i}.mlp.c_proj.weight"].T
    return x @ t["wte.weight"].T


class Attention(tc.TreeClass):
    q: jax.Array  # [in, out]
    k: jax.Array
    v: jax.Array
    bias: jax.Array  # q, k and v biases, fused
    out: jax.Array


class Block(tc.TreeClass):
    attn: Attention
    up: jax.Array
    down: jax.Array

    def __call__(self, x: jax.Array) -> jax.Array:
        a = self.attn
        bq, bk, bv = jnp.split(a.bias, 3)
        q, k, v = x @ a.q + bq, x @ a.k + bk, x @ a.v + bv
        mask = jnp.tril(jnp.ones((len(x), len(x)), bool))
        scores = jnp.where(mask, q @ k.T / jnp.sqrt(WIDTH), -jnp.inf)
        x = x + jax.nn.softmax(scores) @ v @ a.out
        return x + jax.nn.relu(x @ self.up) @ self.down


class GPT(tc.TreeClass):
    embed: jax.Array
    position: jax.Array
    blocks: tuple

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.embed[tokens] + self.position[: len(tokens)]
        for block in self.blocks:
            x = block(x)
        return x @ self.embed.T


def template() -> GPT:
    z = lambda *shape: jnp.zeros(shape, jnp.float32)  # noqa: E731
    blocks = tuple(
        Block(
            Attention(
                z(WIDTH, WIDTH), z(WIDTH, WIDTH), z(WIDTH, WIDTH), z(3 * WIDTH), z(WIDTH, WIDTH)
            ),
            z(WIDTH, 4 * WIDTH),
            z(4 * WIDTH, WIDTH),
        )
        for _ in range(LAYERS)
    )
    return GPT(z(VOCAB, WIDTH), z(CONTEXT, WIDTH), blocks)


RULES = [
    ("wte.weight", "embed"),
    ("wpe.weight", "position"),
    # one fused [3*out, in] tensor -> three [in, out] weights
    (
        "h.{i}.attn.c_attn.weight",
        ["blocks[{i}].attn.q", "blocks[{i}].attn.k", "blocks[{i}].attn.v"],
        lambda w: [part.T for part in jnp.split(w, 3)],
    ),
    ("h.{i}.attn.c_attn.bias", "blocks[{i}].attn.bias"),
    ("h.{i}.attn.c_proj.weight", "blocks[{i}].attn.out", lambda w: w.T),
    ("h.{i}.mlp.c_fc.weight", "blocks[{i}].up", lambda w: w.T),
    ("h.{i}.mlp.c_proj.weight", "blocks[{i}].down", lambda w: w.T),
]


@pytest.fixture
def gpt2_file(tmp_path):
    tensors = gpt2_tensors()
    path = str(tmp_path / "model.safetensors")
    save_file(tensors, path)
    return path, tensors


def test_a_gpt2_style_file_loads_through_rules_and_gives_the_reference_logits(gpt2_file):
    path, tensors = gpt2_file
    model = tc.load(path, template(), rules=RULES)
    tokens = np.array([1, 4, 2, 9, 0])
    np.testing.assert_allclose(
        model(tokens), reference_logits(tensors, tokens), rtol=1e-5, atol=1e-6
    )


def test_an_abstract_template_loads_through_rules(gpt2_file):
    path, tensors = gpt2_file
    model = tc.load(path, jax.eval_shape(template), rules=RULES)
    np.testing.assert_array_equal(model.blocks[1].up, tensors["h.1.mlp.c_fc.weight"].T)


def test_a_dry_run_maps_every_path(gpt2_file):
    path, _ = gpt2_file
    report = tc.load(path, template(), rules=RULES, dry_run=True)
    assert report.messages == () and len(report.restored) == 2 + 7 * LAYERS
    assert report.sources["GPT.blocks[1].attn.k"] == ("h.1.attn.c_attn.weight",)
    assert report.sources["GPT.embed"] == ("wte.weight",)


def test_a_dry_run_reads_no_tensor_bytes(tmp_path):
    path = str(tmp_path / "m.safetensors")
    save_file({"flags": np.array([True, False])}, path)
    with open(path, "rb") as file:
        raw = bytearray(file.read())
    raw[-2] = 7  # a bool byte no reader may accept: only reading the data finds it
    with open(path, "wb") as file:
        file.write(bytes(raw))
    like = {"mask": jnp.zeros(2, bool)}
    report = tc.load(path, like, rules={"flags": "mask"}, dry_run=True)
    assert report.messages == () and report.restored == ("tree['mask']",)
    with pytest.raises(ValueError, match="0 or 1"):
        tc.load(path, like, rules={"flags": "mask"})


def test_a_dry_run_reports_what_would_not_fit(gpt2_file):
    path, _ = gpt2_file
    report = tc.load(path, template(), rules=RULES[:-1], dry_run=True)
    assert report.missing == tuple(f"GPT.blocks[{i}].down" for i in range(LAYERS))
    assert report.unexpected == tuple(f"h.{i}.mlp.c_proj.weight" for i in range(LAYERS))


def test_unmatched_keys_on_both_sides_are_an_error_naming_them(gpt2_file):
    path, _ = gpt2_file
    with pytest.raises(ValueError) as info:
        tc.load(path, template(), rules=RULES[1:])
    message = str(info.value)
    assert "missing     GPT.embed: no 'embed' in the file" in message
    assert "unexpected  'wte.weight'" in message


@LOSSY
def test_a_transform_giving_the_wrong_shape_is_a_mismatch(gpt2_file):
    path, _ = gpt2_file
    rules = [*RULES[:-1], ("h.{i}.mlp.c_proj.weight", "blocks[{i}].down")]  # no transpose
    _, report = tc.load(path, template(), rules=rules, strict=False)
    assert report.mismatched == tuple(f"GPT.blocks[{i}].down" for i in range(LAYERS))
    assert "f32[32,8] in the template, an array f32[8,32] in the file" in (report.messages[0])


def test_several_sources_concatenate_into_one_target(tmp_path):
    path = str(tmp_path / "parts.safetensors")
    save_file(
        {f"l.{n}.{p}": np.full(2, k, np.float32) for n in range(2) for k, p in enumerate("qkv")},
        path,
    )
    like = {"layers": [{"qkv": jnp.zeros(6)} for _ in range(2)]}
    rule = (["l.{n}.q", "l.{n}.k", "l.{n}.v"], "layers[{n}]['qkv']", lambda *p: jnp.concatenate(p))
    restored = tc.load(path, like, rules=[rule])
    assert restored["layers"][1]["qkv"].tolist() == [0, 0, 1, 1, 2, 2]


def test_a_concatenation_lacking_a_part_is_reported(tmp_path):
    path = str(tmp_path / "parts.safetensors")
    save_file({"l.0.q": np.ones(2, np.float32), "l.0.k": np.ones(2, np.float32)}, path)
    rule = (["l.{n}.q", "l.{n}.k", "l.{n}.v"], "qkv.{n}", lambda *p: jnp.concatenate(p))
    with pytest.raises(ValueError, match=r"incomplete .*not \['l\.0\.v'\]"):
        tc.load(path, {"qkv": [jnp.zeros(6)]}, rules=[rule])


def test_a_capture_of_many_segments_moves_a_prefix(tmp_path):
    path = str(tmp_path / "encoder.safetensors")
    tc.save(path, {"layers": [{"w": jnp.ones(2)}], "norm": jnp.ones(1)})
    like = {"encoder": {"layers": [{"w": jnp.zeros(2)}], "norm": jnp.zeros(1)}}
    restored = tc.load(path, like, rules={"{rest*}": "encoder.{rest}"})
    assert restored["encoder"]["layers"][0]["w"].tolist() == [1.0, 1.0]


def test_rules_apply_to_state_dicts_too():
    state = {"model": {"w": np.ones((2, 3), np.float32)}}
    like = {"weight": jnp.zeros((3, 2))}
    restored = tc.from_state_dict(like, state, rules=[("model.w", "weight", lambda w: w.T)])
    assert restored["weight"].shape == (3, 2)


@pytest.mark.parametrize(
    "rules, error",
    [
        ([("a",)], TypeError),
        ([("a", 1)], TypeError),
        ([("a", "b", "not callable")], TypeError),
        ([(["a", "b"], "c")], ValueError),  # two sources need a transform
        ([("a.{i}", "b.{j}")], ValueError),  # j is captured by no source
    ],
)
def test_bad_rules_are_refused(rules, error):
    with pytest.raises(error):
        tc.from_state_dict({"b": jnp.zeros(1)}, {"a": np.zeros(1)}, rules=rules)


@pytest.mark.parametrize(
    "rules, error, says",
    [
        (5, TypeError, r"rules= takes a dict .* got a int 5"),
        ("a", TypeError, r"rules= takes a dict .* got a str 'a'"),
        ({("a", "b")}, TypeError, r"rules= takes a dict .* got a set"),
        ([("a", 5)], TypeError, r"got \('a', 5\)"),
        ([(5, "b")], TypeError, r"got \(5, 'b'\)"),
        ([(["a", 5], "b", sum)], TypeError, r"got \(\['a', 5\], 'b'"),
        ([(["x.w", "x.w"], "b", np.add)], ValueError, r"names 'x.w' twice among its sources"),
        ([("qkv", ["q", "q"], np.split)], ValueError, r"names 'q' twice among its targets"),
    ],
)
def test_a_malformed_rule_table_names_the_rule_and_the_file(tmp_path, rules, error, says):
    path = tmp_path / "m.safetensors"
    save_file({"x.w": np.ones(2, np.float32), "qkv": np.ones(2, np.float32)}, str(path))
    with pytest.raises(error, match=says) as info:
        tc.load(path, {"b": jnp.zeros(2)}, rules=rules)
    assert "m.safetensors" in str(info.value)


@pytest.mark.parametrize(
    "result, says",
    [
        (lambda w: [w], "returned a list; a rule with one target returns one array"),
        (lambda w: (w,), "returned a tuple; a rule with one target returns one array"),
        (lambda w: None, "returned None; a rule with one target returns one array"),
        (lambda w: {"b": w}, "returned a dict; a rule with one target returns one array"),
        (lambda w: "w", "(returned a str; a rule|returned a value of type <class 'str'>)"),
    ],
)
def test_a_transform_returning_no_array_names_the_rule_and_the_file(tmp_path, result, says):
    path = tmp_path / "m.safetensors"
    save_file({"x.w": np.ones(2, np.float32)}, str(path))
    for dry_run in (True, False):
        with pytest.raises(ValueError, match=rf"m\.safetensors.*'x.w' -> 'b'.*{says}"):
            tc.load(path, {"b": jnp.zeros(2)}, rules=[("x.w", "b", result)], dry_run=dry_run)


@pytest.mark.parametrize(
    "result, says",
    [
        (lambda w: {"q": w, "k": w}, "returned a dict; a rule with 2 targets returns a list"),
        (lambda w: None, "returned None; a rule with 2 targets"),
        (lambda w: w, "returned one array; a rule with 2 targets"),
        (lambda w: [w, None], "returned None for the target 'k'; each result is an array"),
        (lambda w: [w, [w]], "returned a list for the target 'k'"),
    ],
)
def test_a_split_returning_other_than_its_arrays_names_the_rule_and_the_file(
    tmp_path, result, says
):
    path = tmp_path / "m.safetensors"
    save_file({"qkv": np.ones(2, np.float32)}, str(path))
    like = {"q": jnp.zeros(2), "k": jnp.zeros(2)}
    transform = lambda w: result(np.asarray(w) if isinstance(w, np.ndarray) else w)  # noqa: E731
    with pytest.raises(ValueError, match=rf"m\.safetensors.*'qkv' -> \['q', 'k'\].*{says}"):
        tc.load(path, like, rules=[("qkv", ["q", "k"], transform)])


def _answers_otherwise(change):
    """A transform that answers one way while checked and another when run."""

    def transform(w):
        return change(w) if isinstance(w, np.ndarray) else w  # traced while checked

    return transform


@pytest.mark.parametrize(
    "change, got",
    [
        (lambda w: w.reshape(1, 4), r"f32\[1,4\]"),
        (lambda w: w.astype(np.int32), r"i32\[4\]"),
        (lambda w: w[:2], r"f32\[2\]"),
    ],
)
def test_what_a_transform_gives_when_run_is_checked_as_what_it_gave_when_checked(
    tmp_path, change, got
):
    path = tmp_path / "m.safetensors"
    save_file({"a": np.ones(4, np.float32)}, str(path))
    like = {"b": np.zeros(4, np.float32)}
    rules = [("a", "b", _answers_otherwise(change))]
    assert tc.load(path, like, rules=rules, dry_run=True).restored == ("tree['b']",)
    with pytest.raises(ValueError, match=rf"m\.safetensors.*gave {got} for 'b' when run, not"):
        tc.load(path, like, rules=rules)
    split = [("a", ["b", "c"], lambda w: [w, _answers_otherwise(change)(w)])]
    like2 = {"b": np.zeros(4, np.float32), "c": np.zeros(4, np.float32)}
    with pytest.raises(ValueError, match=rf"gave {got} for 'c' when run"):
        tc.load(path, like2, rules=split)


def test_errors_of_key_rules_name_the_file_and_the_target(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"a": np.ones(2, np.float32), "b": np.ones(2, np.float32)}, str(path))
    like = {"c": jnp.zeros(2), "d": jnp.zeros(2)}
    failing = [("a", "c", lambda w: w.no_such_method()), ("b", "d")]
    for dry_run in (False, True):
        with pytest.raises(ValueError, match=r"(?s)m\.safetensors.*'a' -> 'c'.*'c'.*AttributeErr"):
            tc.load(path, like, rules=failing, dry_run=dry_run)
    with pytest.raises(ValueError, match=r"m\.safetensors.*map both \['a'\] and \['b'\]"):
        tc.load(path, like, rules=[("a", "c"), ("b", "c")])
    splits = [("a", ["c", "d"], lambda w: [w])]
    with pytest.raises(ValueError, match=r"m\.safetensors.*returned 1 values for 2 targets"):
        tc.load(path, like, rules=splits)


def test_two_names_mapped_to_one_target_are_refused():
    state = {"a": np.zeros(1), "b": np.zeros(1)}
    with pytest.raises(ValueError, match="map both"):
        tc.from_state_dict({"c": jnp.zeros(1)}, state, rules=[("a", "c"), ("b", "c")])


@pytest.mark.parametrize("source", ["layers[{i}].w", "layers.{i}.w", ".layers[{i}]['w']"])
def test_a_source_written_as_a_key_path_matches_the_dotted_file_names(source):
    state = {"layers.0.w": np.ones(2, np.float32), "layers.1.w": np.full(2, 2, np.float32)}
    like = {"blocks": [{"w": jnp.zeros(2)}, {"w": jnp.zeros(2)}]}
    loaded = tc.from_state_dict(like, state, rules=[(source, "blocks[{i}].w")])
    assert [float(block["w"][0]) for block in loaded["blocks"]] == [1.0, 2.0]


def test_a_rule_shadowed_by_an_earlier_one_is_an_error_naming_both():
    one = np.ones(2, np.float32)
    state = {"layers.0.q.weight": one, "layers.0.k.weight": one}
    like = {"layers": [{"q": jnp.zeros(2), "k": {"weight": jnp.zeros(2)}}]}
    shadowed = [
        ("layers.{i}.{rest*}", "layers[{i}].{rest}"),
        ("layers.{i}.q.weight", "layers[{i}].q", lambda w: w * 2),
    ]
    with pytest.raises(ValueError) as error:
        tc.from_state_dict(like, state, rules=shadowed)
    message = str(error.value)
    assert "key rule 'layers.{i}.q.weight' -> 'layers.{i}.q' matches 'layers.0.q.weight'" in (
        message
    )
    assert "read by an earlier key rule, 'layers.{i}.{rest*}' -> 'layers.{i}.{rest}'" in message
    assert "Put the narrower rule first" in message
    # the narrower rule first: each rule reads some name, and the first match wins
    loaded = tc.from_state_dict(like, state, rules=[shadowed[1], shadowed[0]])
    layer = loaded["layers"][0]
    assert layer["q"].tolist() == [2.0, 2.0] and layer["k"]["weight"].tolist() == [1.0, 1.0]


def test_a_name_captured_twice_in_a_source_matches_equal_values_only():
    one = np.ones(2, np.float32)
    state = {"h.0.to.0": one, "h.0.to.1": 2 * one, "h.1.to.1": 3 * one}
    like = {"self": [jnp.zeros(2), jnp.zeros(2)], "h": {"0": {"to": {"1": jnp.zeros(2)}}}}
    loaded = tc.from_state_dict(like, state, rules=[("h.{i}.to.{i}", "self[{i}]")])
    assert [w.tolist() for w in loaded["self"]] == [[1.0, 1.0], [3.0, 3.0]]
    assert loaded["h"]["0"]["to"]["1"].tolist() == [2.0, 2.0]  # under its own name


def test_a_rule_matching_no_name_of_the_file_is_no_error():
    # one table serves a family of files: a tied model's file has no head
    rules = [("emb", "embed"), ("lm_head", "head")]
    state = {"emb": np.ones(2, np.float32)}
    loaded = tc.from_state_dict({"embed": jnp.zeros(2)}, state, rules=rules)
    assert loaded["embed"].tolist() == [1.0, 1.0]


@pytest.mark.parametrize(
    "rule, says",
    [
        (("layers.*.w", "w"), r"'layers\.\*\.w' has the wildcard segment '\*'"),
        (("a", "**.b"), r"wildcard segment '\*\*'"),
        (("a.{i", "b"), r"Stray '\{' in 'a\.\{i'"),
        (("a.x{r*}", "b.{r}"), r"takes one or more whole segments"),
    ],
)
def test_a_pattern_a_key_rule_cannot_write_back_is_refused_with_the_fix(rule, says):
    with pytest.raises(ValueError, match=says):
        tc.from_state_dict({"b": jnp.zeros(1)}, {"a": np.zeros(1)}, rules=[rule])


# ------------------------------------------------------------------------------------------
# partial loads
# ------------------------------------------------------------------------------------------


class Model(tc.TreeClass):
    encoder: dict
    head: jax.Array


def _model(value: float) -> Model:
    return Model({"w": jnp.full(2, value), "b": jnp.full(1, value)}, jnp.full(3, value))


def test_a_partial_load_restores_the_selection_and_keeps_the_rest(tmp_path):
    path = tmp_path / "pretrained.safetensors"
    tc.save(path, {"encoder": {"w": jnp.ones(2), "b": jnp.ones(1)}, "other": jnp.ones(5)})
    like = _model(0.0)
    restored, report = tc.load(
        path, like, where=like.at["encoder"], unexpected="ignore", strict=False
    )
    assert restored.encoder["w"].tolist() == [1.0, 1.0] and restored.head is like.head
    assert report.restored == ("Model.encoder['b']", "Model.encoder['w']")
    assert report.missing == () and report.unexpected == ("other",)


def test_a_strict_partial_load_still_checks_the_selection(tmp_path):
    path = tmp_path / "pretrained.safetensors"
    tc.save(path, {"encoder": {"w": jnp.ones(3)}, "head": jnp.ones(3)})
    like = _model(0.0)
    with pytest.raises(ValueError, match=r"(?s)1 problem.*shape +Model\.encoder\['w'\]") as info:
        tc.load(path, like, where=like.at["encoder"]["w"])
    assert "head" not in str(info.value)


def test_a_selection_by_mask_or_selector(tmp_path):
    path = tmp_path / "m.safetensors"
    tc.save(path, _model(1.0))
    like = _model(0.0)
    mask = like.at[...].set(False).at["head"].set(True)
    restored = tc.load(path, like, where=mask)
    assert restored.head.tolist() == [1.0] * 3 and restored.encoder["w"].tolist() == [0.0] * 2
    restored = tc.load(path, like, where=tc.glob("encoder.*"))
    assert restored.encoder["w"].tolist() == [1.0] * 2 and restored.head.tolist() == [0.0] * 3


def test_a_selection_by_predicate_sees_the_template_values(tmp_path):
    path = tmp_path / "m.safetensors"
    tc.save(path, _model(1.0))
    like = _model(0.0)
    restored = tc.load(path, like, where=tc.where(lambda _, x: getattr(x, "shape", ()) == (3,)))
    assert restored.head.tolist() == [1.0] * 3 and restored.encoder["w"].tolist() == [0.0] * 2


def test_a_selection_of_part_of_a_leaf_is_refused_naming_it(tmp_path):
    path = tmp_path / "m.safetensors"
    tc.save(path, _model(1.0))
    like = _model(0.0)
    with pytest.raises(ValueError, match=r"part of the leaf at Model\.head .*whole leaves"):
        tc.load(path, like, where=like.at["head"][jnp.array([True, False, True])])


def test_missing_keys_can_be_kept_or_warned_about(tmp_path):
    path = tmp_path / "m.safetensors"
    tc.save(path, {"encoder": {"w": jnp.ones(2), "b": jnp.ones(1)}})
    like = _model(0.0)
    restored = tc.load(path, like, missing="keep")
    assert restored.head is like.head and restored.encoder["w"].tolist() == [1.0, 1.0]
    with pytest.warns(UserWarning, match=r"Model\.head"):
        tc.load(path, like, missing="warn")
    with pytest.raises(ValueError, match=r"missing +Model\.head"):
        tc.load(path, like, missing="error")


def test_extra_keys_can_be_ignored(tmp_path):
    path = tmp_path / "m.safetensors"
    tc.save(path, {"encoder": {"w": jnp.ones(2), "b": jnp.ones(1)}, "head": jnp.ones(3), "x": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restored = tc.load(path, _model(0.0), unexpected="ignore")
    assert restored.head.tolist() == [1.0] * 3
    with pytest.raises(ValueError, match="unexpected  'x'"):
        tc.load(path, _model(0.0))


def test_an_explicit_error_policy_raises_in_a_non_strict_load_too(tmp_path):
    path = tmp_path / "m.safetensors"
    tc.save(path, {"encoder": {"w": jnp.ones(2), "b": jnp.ones(1)}, "x": jnp.ones(1)})
    like = _model(0.0)
    with pytest.raises(ValueError, match=r"missing +Model\.head") as info:
        tc.load(path, like, strict=False, missing="error")
    message = str(info.value)
    assert "unexpected" not in message and 'missing="keep"' in message
    with pytest.raises(ValueError, match="unexpected  'x'") as info:
        tc.load(path, like, strict=False, unexpected="error", missing="keep")
    assert "Model.head" not in str(info.value) and 'unexpected="ignore"' in str(info.value)
    with pytest.raises(ValueError, match=r"missing +tree\['c'\]"):
        tc.from_state_dict({"c": jnp.zeros(1)}, {}, strict=False, missing="error")
    # the other problems are still reported, not raised
    restored, report = tc.load(path, like, strict=False, missing="keep")
    assert report.missing == ("Model.head",) and report.unexpected == ("x",)
    assert restored.encoder["w"].tolist() == [1.0, 1.0]


def test_a_non_strict_load_with_an_error_policy_leaves_its_template_as_it_was(tmp_path):
    path = tmp_path / "m.safetensors"
    tc.save(path, {"encoder": {"w": jnp.ones(2), "b": jnp.ones(1)}})
    like = _model(0.0)
    before = jax.tree_util.tree_map(np.asarray, like)
    with pytest.raises(ValueError):
        tc.load(path, like, strict=False, missing="error")
    assert tc.is_tree_equal(jax.tree_util.tree_map(np.asarray, like), before)


def test_bad_policies_are_refused():
    with pytest.raises(ValueError, match="missing= takes one of"):
        tc.from_state_dict({"a": jnp.ones(1)}, {"a": np.ones(1)}, missing="ignore")  # type: ignore[call-overload]


def test_a_selection_of_another_tree_is_refused(tmp_path):
    other = _model(2.0)
    with pytest.raises(ValueError, match="selection of the template itself"):
        tc.from_state_dict(_model(0.0), tc.state_dict(other), where=other.at["head"])


def test_the_report_says_which_leaves_came_from_the_checkpoint():
    like: Any = {"a": jnp.zeros(1), "b": jnp.zeros(1)}
    _, report = tc.from_state_dict(like, {"a": np.ones(1, np.float32)}, strict=False)
    assert report.restored == ("tree['a']",) and report.missing == ("tree['b']",)
    assert dict(report.sources) == {"tree['a']": ("a",)}


# ------------------------------------------------------------------------------------------
# the same options through from_state_dict
# ------------------------------------------------------------------------------------------


def test_a_dry_run_of_a_state_dict_runs_transforms_on_shapes_only():
    seen = []

    def transpose(w: Any) -> Any:
        seen.append(type(w))
        return w.T

    state = {"model": {"w": np.ones((2, 3), np.float32), "extra": np.ones(1, np.float32)}}
    like = {"weight": jnp.zeros((3, 2)), "bias": jnp.zeros(2)}
    report = tc.from_state_dict(like, state, rules=[("model.w", "weight", transpose)], dry_run=True)
    assert type(report).__name__ == "LoadReport"
    assert report.restored == ("tree['weight']",) and report.missing == ("tree['bias']",)
    assert report.unexpected == ("model.extra",)
    assert dict(report.sources) == {"tree['weight']": ("model.w",)}
    assert seen and np.ndarray not in seen  # shapes only: the array was never transposed


def test_a_partial_load_from_a_state_dict_keeps_the_rest():
    like = _model(0.0)
    state = tc.state_dict(_model(1.0))
    restored, report = tc.from_state_dict(like, state, where=like.at["head"], strict=False)
    assert restored.head.tolist() == [1.0] * 3 and restored.encoder["w"] is like.encoder["w"]
    assert report.restored == ("Model.head",) and report.unexpected == ()
    assert report.messages == ()


def test_a_strict_load_with_lenient_policies_restores_what_is_there():
    like = _model(0.0)
    state = {"head": np.ones(3, np.float32), "other": np.ones(1, np.float32)}
    restored = tc.from_state_dict(like, state, missing="keep", unexpected="ignore")
    assert restored.head.tolist() == [1.0] * 3 and restored.encoder["b"] is like.encoder["b"]
    with pytest.warns(UserWarning, match=r"(?s)2 template path.*Model\.encoder\['b'\]"):
        tc.from_state_dict(like, state, missing="warn", unexpected="ignore")
    with pytest.raises(ValueError, match=r"(?s)1 problem.*unexpected  'other'"):
        tc.from_state_dict(like, state, missing="keep")


def test_a_dry_run_of_a_partial_load_reports_the_selection_only(tmp_path):
    path = tmp_path / "m.safetensors"
    tc.save(path, {"encoder": {"w": jnp.ones(3)}, "head": jnp.ones(3)})
    like = _model(0.0)
    report = tc.load(path, like, where=like.at["encoder"], dry_run=True)
    assert report.missing == ("Model.encoder['b']",)
    assert report.mismatched == ("Model.encoder['w']",) and report.restored == ()
    assert report.unexpected == ()  # `head` belongs to the template, outside the selection


def test_key_rules_and_a_selection_combine(tmp_path):
    path = str(tmp_path / "m.safetensors")
    save_file({"enc.w": np.ones(2, np.float32), "enc.b": np.ones(1, np.float32)}, path)
    like = _model(0.0)
    rules = {"enc.{name}": "encoder['{name}']"}
    restored, report = tc.load(path, like, rules=rules, where=tc.glob("encoder.*"), strict=False)
    assert restored.encoder["w"].tolist() == [1.0, 1.0] and restored.head is like.head
    assert report.sources["Model.encoder['w']"] == ("enc.w",) and report.kept == ()


def test_a_transform_keeps_the_files_64_bit_dtype(tmp_path):
    path = str(tmp_path / "f64.safetensors")
    save_file({"a": np.array([1.5, 2.5]), "n": np.arange(2)}, path)
    like = {"ab": np.zeros((1, 2)), "n": np.zeros((2, 1), np.int64)}
    rules = [("a", "ab", lambda a: a.reshape(1, 2)), ("n", "n", lambda n: jnp.reshape(n, (2, 1)))]
    assert tc.load(path, like, rules=rules, dry_run=True).mismatched == ()
    restored = tc.load(path, like, rules=rules)
    assert restored["ab"].dtype == np.float64 and restored["ab"].tolist() == [[1.5, 2.5]]
    assert restored["n"].dtype == np.int64 and restored["n"].tolist() == [[0], [1]]


def test_a_missing_path_a_rule_should_give_names_what_the_rule_reads_and_the_closest(tmp_path):
    path = str(tmp_path / "t.safetensors")
    tensors = {
        "h.0.attn.c_attn.weight": np.ones((2, 3), np.float32),
        "h.0.mlp.c_fc.weights": np.ones((2, 2), np.float32),  # the rule says "weight"
    }
    save_file(tensors, path)
    like = {"blocks": [{"attn": {"qkv": jnp.zeros((3, 2))}, "mlp": {"up": jnp.zeros((2, 2))}}]}
    rules = [
        ("h.{i}.attn.c_attn.weight", "blocks[{i}].attn.qkv", lambda w: w.T),
        ("h.{i}.mlp.c_fc.weight", "blocks[{i}].mlp.up"),
    ]
    with pytest.raises(ValueError) as info:
        tc.load(path, like, rules=rules)
    message = str(info.value)
    assert (
        "no 'blocks.0.mlp.up' in the file (a key rule reads it from 'h.0.mlp.c_fc.weight'; "
        "closest: 'h.0.mlp.c_fc.weights')" in message
    ), message
    assert "unexpected  'h.0.mlp.c_fc.weights'" in message
    # the same hint in a non-strict report, and without a near name only what the rule reads
    with pytest.warns(UserWarning, match=r"\('h.\{i\}.mlp.c_fc.weights', 'blocks.\{i\}.mlp.up'\)"):
        _, report = tc.load(path, like, rules=rules, strict=False)  # the one [2,2] each side
    assert any("reads it from 'h.0.mlp.c_fc.weight'" in line for line in report.messages)
    del tensors["h.0.mlp.c_fc.weights"]
    save_file(tensors, path)
    with pytest.raises(ValueError, match=r"a key rule reads it from 'h\.0\.mlp\.c_fc\.weight'\)"):
        tc.load(path, like, rules=rules)


# ------------------------------------------------------------------------------------------
# what a failed load suggests: the fix that fits each problem, never a blanket waiver
# ------------------------------------------------------------------------------------------


def _refusal(path, like, **options) -> str:
    with pytest.raises(ValueError) as info:
        tc.load(path, like, **options)
    message = str(info.value)
    assert "strict=False" not in message
    return message


def test_a_renamed_per_layer_layout_suggests_one_key_rule_with_captures(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({f"layers.{i}.w": np.ones((2, 3), np.float32) for i in range(3)}, str(path))
    like = {"blocks": [{"w": jnp.zeros((2, 3))} for _ in range(3)]}
    message = _refusal(path, like)
    assert "rules=[('layers.{i}.w', 'blocks.{i}.w')]" in message
    assert 'missing="keep"' not in message and 'unexpected="ignore"' not in message
    rules = [("layers.{i}.w", "blocks.{i}.w")]
    assert tc.load(path, like, rules=rules)["blocks"][2]["w"].tolist() == [[1.0] * 3] * 2


def test_a_renamed_transposed_weight_suggests_the_transpose(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"fc.weight": np.ones((3, 4), np.float32)}, str(path))
    message = _refusal(path, {"weight": jnp.zeros((4, 3))})
    assert "rules=[('fc.weight', 'weight', lambda w: w.T)]" in message


def test_a_transposed_weight_under_its_own_name_suggests_the_transpose(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"w": np.ones((3, 4), np.float32)}, str(path))
    message = _refusal(path, {"w": jnp.zeros((4, 3))})
    assert "stored transposed ([3, 4] for [4, 3]): rules=[('w', 'w', lambda w: w.T)]" in message


def test_a_transposed_weight_of_another_dtype_suggests_both_steps(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"w": np.ones((3, 4), np.float16)}, str(path))
    message = _refusal(path, {"w": jnp.zeros((4, 3))})
    suggested = "rules=[('w', 'w', lambda w: w.T.astype(jnp.float32))]"
    assert f"stored transposed ([3, 4] for [4, 3]): {suggested}" in message
    assert tc.load(
        path, {"w": jnp.zeros((4, 3))}, rules=[("w", "w", lambda w: w.T.astype(jnp.float32))]
    )["w"].shape == (4, 3)


def test_another_dtype_suggests_astype_in_a_rule(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"w": np.ones(2, np.float32)}, str(path))
    message = _refusal(path, {"w": jnp.zeros(2, jnp.bfloat16)})
    assert "rules=[('w', 'w', lambda w: w.astype(jnp.bfloat16))]" in message
    rules = [("w", "w", lambda w: w.astype(jnp.bfloat16))]
    assert tc.load(path, {"w": jnp.zeros(2, jnp.bfloat16)}, rules=rules)["w"].dtype == jnp.bfloat16


def test_a_weight_of_another_shape_suggests_the_saved_configuration_not_a_rule(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"w": np.ones((3, 5), np.float32)}, str(path))
    message = _refusal(path, {"w": jnp.zeros((4, 3))})
    assert "tree['w'] has another shape in the file ([3, 5] for [4, 3])" in message
    assert "the configuration the checkpoint was saved with" in message
    assert "rules=" not in message


def test_a_path_an_abstract_template_cannot_fill_suggests_concrete_arrays(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"w": np.ones(3, np.float32)}, str(path))
    like = {"w": jnp.zeros(3), "v": jax.ShapeDtypeStruct((2,), jnp.float32)}
    message = _refusal(path, like)
    assert 'build the template with concrete arrays and load with missing="keep"' in message
    assert "leaf left unrestored" not in message  # keeping is no fix for an abstract leaf


def test_a_renamed_tensor_among_others_of_its_shape_is_paired_by_its_related_name(tmp_path):
    path = tmp_path / "m.safetensors"
    tensors = {"model.embed_tokens": np.ones((3, 2), np.float32), "zz": np.ones((3, 2), np.float32)}
    save_file(tensors, str(path))
    like = {"embed": jnp.zeros((3, 2))}
    message = _refusal(path, like)
    assert "rules=[('model.embed_tokens', 'embed')]" in message
    assert "('zz', 'embed')" not in message  # the other tensor of that shape is no match
    rules = [("model.embed_tokens", "embed")]
    assert (
        tc.load(path, like, rules=rules, unexpected="ignore")["embed"].tolist() == [[1.0] * 2] * 3
    )


def test_a_per_layer_checkpoint_into_a_stacked_model_suggests_the_stack_rule(tmp_path):
    class Block(tc.TreeClass):
        w: jax.Array

    class Net(tc.TreeClass):
        blocks: tc.Stacked

    per_layer = Net([Block(jnp.full((2,), float(i))) for i in range(3)])
    path = tmp_path / "m.safetensors"
    tc.save(path, per_layer)
    stacked = Net(tc.Stacked.from_blocks([Block(jnp.zeros(2)) for _ in range(3)]))
    message = _refusal(path, stacked)
    assert "Net.blocks.w is a stack of 3 layers" in message
    assert "rules=[('blocks.{i}.w', 'blocks[{i}].w')]" in message
    restored = tc.load(path, stacked, rules=[("blocks.{i}.w", "blocks[{i}].w")])  # the fix, run
    assert restored.blocks.tree.w.tolist() == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]


def test_per_layer_weights_stored_out_in_suggest_the_transpose_for_the_square_ones_too(tmp_path):
    class Block(tc.TreeClass):
        up: jax.Array
        sq: jax.Array

    class Net(tc.TreeClass):
        blocks: tc.Stacked

    rng = np.random.default_rng(0)
    tensors = {}
    for i in range(3):  # stored [out, in], as PyTorch does
        tensors[f"h.{i}.up"] = rng.normal(size=(3, 2)).astype(np.float32)
        tensors[f"h.{i}.sq"] = rng.normal(size=(2, 2)).astype(np.float32)
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))
    blocks = [Block(jnp.zeros((2, 3)), jnp.zeros((2, 2))) for _ in range(3)]
    like = Net(tc.Stacked.from_blocks(blocks))
    message = _refusal(path, like)
    rules = [
        ("h.{i}.up", "blocks[{i}].up", lambda w: w.T),
        ("h.{i}.sq", "blocks[{i}].sq", lambda w: w.T),  # square: the file's others tell
    ]
    for rule in rules:
        assert f"rules=[({rule[0]!r}, {rule[1]!r}, lambda w: w.T)]" in message
    restored = tc.load(path, like, rules=rules)  # the fixes, run
    assert restored.blocks.tree.sq[2].tolist() == tensors["h.2.sq"].T.tolist()


def test_a_rename_in_a_treeclass_file_suggests_a_migration_too(tmp_path):
    class Linear(tc.TreeClass):
        dense_weight: jax.Array

    path = tmp_path / "m.safetensors"
    tc.save(path, Linear(jnp.ones(2)))

    class Linear(tc.TreeClass):
        weight: jax.Array

    message = _refusal(path, Linear(jnp.zeros(2)))
    assert "rules=[('dense_weight', 'weight')]" in message
    assert "version=" in message and "migrations=" in message


def test_a_non_strict_load_that_restored_less_than_it_could_warns_with_the_count(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"a": np.ones(2, np.float32), "bb": np.ones(3, np.float32)}, str(path))
    like = {"a": jnp.zeros(3), "b": jnp.zeros(3), "c": jnp.zeros(1), "d": jnp.zeros(1)}
    with pytest.warns(UserWarning, match=r"restored 0 of .*; 1 more .*: tree\['b'\]\. Fix") as info:
        tc.load(path, like, strict=False)  # `a` has another shape: nothing restores it
    assert "rules=[('bb', 'b')]" in str(info[0].message)
    assert "another shape" not in str(info[0].message)
    # nothing in the file that could have filled what was kept: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tc.load(path, {"bb": jnp.zeros(3), "x": jnp.zeros(1)}, strict=False, unexpected="ignore")


# -- per-layer names onto the blocks of a stack, in one load -----------------------------------


def stacked_template() -> GPT:
    unrolled = template()
    return GPT(unrolled.embed, unrolled.position, tc.Stacked.from_blocks(unrolled.blocks))


def test_per_layer_names_load_into_a_stacked_model_with_the_same_rules(gpt2_file):
    path, tensors = gpt2_file
    unrolled = tc.load(path, template(), rules=RULES)
    stacked = tc.load(path, stacked_template(), rules=RULES)
    assert stacked.blocks.tree.attn.q.shape == (LAYERS, WIDTH, WIDTH)
    assert tc.is_tree_equal(tuple(tc.unstack_all(stacked).blocks), unrolled.blocks)
    abstract = tc.load(path, jax.eval_shape(stacked_template), rules=RULES)
    assert tc.is_tree_equal(abstract, stacked)


def test_a_stacked_load_reports_every_layer_as_a_source(gpt2_file):
    path, _ = gpt2_file
    report = tc.load(path, stacked_template(), rules=RULES, dry_run=True)
    assert report.messages == () and report.unexpected == ()
    assert report.sources["GPT.blocks.attn.k"] == tuple(
        f"h.{i}.attn.c_attn.weight" for i in range(LAYERS)
    )


def test_a_stacked_load_reads_each_tensor_once(gpt2_file, monkeypatch):
    from treeclass._checkpoint.formats import _safetensors

    path, tensors = gpt2_file
    reads: list[str] = []
    original = _safetensors.SafetensorsFile.read

    def counted(self, key):
        reads.append(key)
        return original(self, key)

    monkeypatch.setattr(_safetensors.SafetensorsFile, "read", counted)
    tc.load(path, stacked_template(), rules=RULES)
    assert sorted(reads) == sorted(tensors)  # the fused c_attn too, split once per layer


class _Local(tc.TreeClass):
    w: jax.Array


class _Global(tc.TreeClass):
    w: jax.Array
    g: jax.Array


class _PeriodicNet(tc.TreeClass):
    layers: tc.Periodic


def _periodic_net():
    """Two repeats of a pattern local, local, global: layers 2 and 5 have a `g` too."""
    pattern = [_Local(jnp.zeros(2)), _Local(jnp.zeros(2)), _Global(jnp.zeros(2), jnp.zeros(3))]
    return _PeriodicNet(tc.Periodic.from_layers(pattern * 2, 3))


def test_a_periodic_stack_takes_per_layer_names_in_layer_order(tmp_path):
    like = _periodic_net()
    tensors = {f"model.layers.{i}.w": np.full(2, i, np.float32) for i in range(6)}
    tensors.update({f"model.layers.{i}.g": np.full(3, -i, np.float32) for i in (2, 5)})
    save_file(tensors, str(tmp_path / "m.safetensors"))
    model = tc.load(tmp_path / "m.safetensors", like, rules=[("model.{name*}", "{name*}")])
    assert [layer.w[0].item() for layer in model.layers] == [0, 1, 2, 3, 4, 5]
    assert [model.layers[i].g[0].item() for i in (2, 5)] == [-2, -5]


def test_a_periodic_stack_refusal_suggests_the_per_layer_rules_that_load_it(tmp_path):
    like = _periodic_net()
    tensors = {f"h.{i}.w": np.full(2, i, np.float32) for i in range(6)}
    tensors.update({f"h.{i}.g": np.full(3, -i, np.float32) for i in (2, 5)})
    path = str(tmp_path / "m.safetensors")
    save_file(tensors, path)
    message = _refusal(path, like)
    assert (
        "_PeriodicNet.layers.pattern[1].w is a stack of 2 layers, and the checkpoint holds "
        "them one by one ('h.{i}.w' for i in 1, 4): map each onto its block of the stack with "
        "a key rule, "
        "rules=[('h.{i}.w', 'layers[{i}].w')]" in message
    )
    assert "rules=[('h.{i}.g', 'layers[{i}].g')]" in message
    assert "unstack_all" not in message  # the rules load it in one go
    model = tc.load(path, like, rules=[("h.{i}.w", "layers[{i}].w"), ("h.{i}.g", "layers[{i}].g")])
    assert [layer.w[0].item() for layer in model.layers] == [0, 1, 2, 3, 4, 5]
    assert [model.layers[i].g[0].item() for i in (2, 5)] == [-2, -5]


def _stack_refusal(tensors, tmp_path, like=None, **options) -> str:
    path = str(tmp_path / "m.safetensors")
    save_file(tensors, path)
    return _refusal(path, like if like is not None else stacked_template(), rules=RULES, **options)


def test_a_stack_lacking_a_layer_names_the_layer_and_the_tensor_to_read(tmp_path):
    tensors = {k: v for k, v in gpt2_tensors().items() if k != "h.1.mlp.c_fc.weight"}
    message = _stack_refusal(tensors, tmp_path, missing="keep")  # a policy does not waive it
    assert "incomplete  'blocks.up' (a stack of 2 at 'blocks')" in message
    assert "gives 1 of its 2 layers" in message and "it lacks layer 1" in message
    assert "no 'h.1.mlp.c_fc.weight' in the file" in message
    assert "missing  " not in message  # the line above says it all
    assert "lacks layers of the stack at 'blocks' (1): it is incomplete" in message


def test_a_checkpoint_of_fewer_layers_suggests_the_template_of_its_depth(tmp_path):
    tensors = {k: v for k, v in gpt2_tensors().items() if not k.startswith("h.1.")}
    message = _stack_refusal(tensors, tmp_path)
    assert "holds the first 1 layers of every leaf of the stack at 'blocks', which has 2" in message
    assert "build the template with 1 blocks" in message


def test_a_layer_beyond_the_stack_is_unexpected_by_its_per_layer_name(tmp_path):
    tensors = gpt2_tensors()
    tensors["h.2.mlp.c_fc.weight"] = tensors["h.0.mlp.c_fc.weight"]
    message = _stack_refusal(tensors, tmp_path)
    assert "unexpected  'blocks.2.up' (an array f32[8,32]) in the file (read from " in message
    assert "'h.2.mlp.c_fc.weight'): the template has no such path" in message
    assert (
        "holds layer 2 beyond the 2 of the stack at 'blocks': build the template with 3" in message
    )
    path = str(tmp_path / "m.safetensors")
    model = tc.load(path, stacked_template(), rules=RULES, unexpected="ignore")
    assert model.blocks.tree.up.shape == (LAYERS, WIDTH, 4 * WIDTH)


def test_layers_of_another_shape_are_an_error_naming_both(tmp_path):
    tensors = gpt2_tensors()
    tensors["h.1.mlp.c_proj.weight"] = np.zeros((WIDTH, 3 * WIDTH), np.float32)
    message = _stack_refusal(tensors, tmp_path)
    assert "layers      'blocks.down'" in message
    assert "layer 'blocks.1.down' is f32[24,8] (from ['h.1.mlp.c_proj.weight'])" in message
    assert "layer 'blocks.0.down' f32[32,8]" in message


def test_a_stacked_leaf_given_whole_and_by_layer_is_an_error(tmp_path):
    tensors = gpt2_tensors()
    tensors["blocks.up"] = np.zeros((LAYERS, WIDTH, 4 * WIDTH), np.float32)
    path = str(tmp_path / "m.safetensors")
    save_file(tensors, path)
    with pytest.raises(ValueError, match=r"to the stacked 'blocks.up' and per-layer names"):
        tc.load(path, stacked_template(), rules=RULES)


def test_two_names_for_one_layer_are_an_error(tmp_path):
    tensors = gpt2_tensors()
    tensors["layer.0.up"] = tensors["h.0.mlp.c_fc.weight"]
    path = str(tmp_path / "m.safetensors")
    save_file(tensors, path)
    rules = [*RULES, ("layer.{i}.up", "blocks[{i}].up", lambda w: w.T)]
    with pytest.raises(ValueError, match=r"map both .* to 'blocks.0.up'"):
        tc.load(path, stacked_template(), rules=rules)


# -- export: the same rules, run backwards -----------------------------------------------------


def test_export_writes_the_file_the_rules_load_byte_for_byte(gpt2_file, tmp_path):
    path, tensors = gpt2_file
    for like in (template(), stacked_template()):
        model = tc.load(path, like, rules=RULES)
        out = tmp_path / "out.safetensors"
        tc.save(out, model, rules=RULES)
        written = load_file(str(out))
        assert list(written) == sorted(tensors, key=_natural)  # layer 2 before layer 10
        for name, array in tensors.items():
            assert written[name].dtype == array.dtype and written[name].shape == array.shape
            assert written[name].tobytes() == array.tobytes(), name
        assert tc.is_tree_equal(tc.load(out, like, rules=RULES), model)


def _natural(name):
    return [(0, int(p)) if p.isdigit() else (1, p) for p in name.split(".")]


def test_state_dict_with_rules_is_the_foreign_layout_and_from_state_dict_reads_it(gpt2_file):
    path, tensors = gpt2_file
    model = tc.load(path, stacked_template(), rules=RULES)
    foreign = tc.state_dict(model, rules=RULES)
    assert set(foreign) == set(tensors)
    assert all(isinstance(v, np.ndarray) for v in foreign.values())
    assert all(foreign[k].tobytes() == tensors[k].tobytes() for k in tensors)
    assert tc.is_tree_equal(tc.from_state_dict(stacked_template(), foreign, rules=RULES), model)


def test_export_inverts_element_moves_it_recognises():
    rng = np.random.default_rng(1)
    w = rng.normal(size=(4, 6)).astype(np.float32)
    cases = [
        ("w", "a", lambda w: w.T),
        ("w", "a", lambda w: w.reshape(w.shape[0] // 2, 2, w.shape[1])),  # rows in pairs
        ("w", ["a", "b"], lambda w: jnp.split(w, 2, axis=-1)),
        ("w", ["a", "b"], lambda w: [p.T for p in jnp.split(w, 2)]),
        ("w", "a", lambda w: w[::-1]),
        ("w", "a", lambda w: jnp.swapaxes(w, 0, 1)[:, ::-1]),
    ]
    for rule in cases:
        model = tc.from_state_dict(_like_for(rule, w), {"w": w}, rules=[rule])
        back = tc.state_dict(model, rules=[rule])
        assert list(back) == ["w"] and back["w"].tobytes() == w.tobytes(), rule


def _like_for(rule, w):
    results = rule[2](w)
    targets = [rule[1]] if isinstance(rule[1], str) else rule[1]
    results = [results] if len(targets) == 1 else results
    return {t: jnp.zeros(np.shape(r)) for t, r in zip(targets, results)}


def test_export_concatenates_what_a_rule_split_and_splits_what_it_joined():
    q, k = np.ones((2, 3), np.float32), np.full((2, 3), 2.0, np.float32)
    join = (["h.q", "h.k"], "qk", lambda q, k: jnp.concatenate([q, k]))
    model = tc.from_state_dict({"qk": jnp.zeros((4, 3))}, {"h": {"q": q, "k": k}}, rules=[join])
    back = tc.state_dict(model, rules=[join])
    assert back["h.q"].tolist() == q.tolist() and back["h.k"].tolist() == k.tolist()


def test_a_transform_that_is_not_a_move_asks_for_its_inverse():
    w = np.ones((2, 3), np.float32)
    for transform in (lambda w: w * 2, lambda w: w.astype(jnp.bfloat16), jnp.abs, jnp.sort):
        rule = ("fc.w", "w", transform)
        model = tc.from_state_dict(
            {"w": transform(jnp.zeros((2, 3)))}, {"fc": {"w": w}}, rules=[rule]
        )
        with pytest.raises(ValueError, match=r"key rule 'fc.w' -> 'w' cannot be inverted") as info:
            tc.state_dict(model, rules=[rule])
        assert "fourth element, (source, target, transform, inverse)" in str(info.value)


def test_a_rule_carries_its_inverse_as_a_fourth_element(tmp_path):
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    rule = ("fc.w", "w", lambda w: w.astype(jnp.bfloat16), lambda w: w.astype(jnp.float32))
    path = tmp_path / "m.safetensors"
    save_file({"fc.w": w}, str(path))
    model = tc.load(path, {"w": jnp.zeros((2, 3), jnp.bfloat16)}, rules=[rule])
    tc.save(tmp_path / "out.safetensors", model, rules=[rule])
    assert load_file(str(tmp_path / "out.safetensors"))["fc.w"].tobytes() == w.tobytes()
    wrong = (*rule[:3], lambda w: w)  # an inverse giving bfloat16: the file would differ
    tc.save(tmp_path / "bf.safetensors", model, rules=[wrong])
    assert load_file(str(tmp_path / "bf.safetensors"))["fc.w"].dtype.name == "bfloat16"
    with pytest.raises(TypeError, match="fourth element is the transform's inverse"):
        tc.state_dict(model, rules=[("fc.w", "w", None, lambda w: w)])


def test_a_reshape_from_several_possible_shapes_asks_for_its_inverse():
    rule = ("w", "a", lambda w: w.reshape(4, 4))
    model = {"a": jnp.zeros((4, 4))}
    with pytest.raises(ValueError, match=r"several source shapes \(\(\[4,4\]\) or \(\[16\]\)"):
        tc.state_dict(model, rules=[rule])
    explicit = (*rule, lambda a: a.reshape(16))
    assert tc.state_dict(model, rules=[explicit])["w"].shape == (16,)


def test_tied_weights_are_written_once_and_must_be_equal(tmp_path):
    embed = np.arange(6, dtype=np.float32).reshape(3, 2)
    tied = ("emb", ["embed", "head"], lambda w: (w, w.T))
    model = tc.from_state_dict(
        {"embed": jnp.zeros((3, 2)), "head": jnp.zeros((2, 3))}, {"emb": embed}, rules=[tied]
    )
    assert list(tc.state_dict(model, rules=[tied])) == ["emb"]
    untied = {**model, "head": model["head"] + 1}
    with pytest.raises(ValueError, match=r"tied weights are written once"):
        tc.state_dict(untied, rules=[tied])


def test_a_name_load_would_read_through_another_rule_is_refused_before_export():
    model = {"embed": jnp.zeros((3, 2)), "head": jnp.zeros((2, 3))}
    # load reads 'emb' through the first rule only: the second would never fill 'head'
    twice = [("emb", "embed"), ("emb", "head", lambda w: w.T)]
    with pytest.raises(
        ValueError,
        match=r"'emb' -> 'head' writes 'emb', which load reads through key rule "
        r"'emb' -> 'embed': the table would not read back what it writes",
    ):
        tc.state_dict(model, rules=twice)
    with pytest.raises(ValueError, match=r"\['embed'\] \(under its own name\) writes 'embed', "):
        tc.state_dict(model, rules=[("embed", "head", lambda w: w.T)])


def test_a_name_two_rules_could_have_given_is_an_error_naming_both():
    rules = [("a.{n}.w", "{n}.w"), ("b.norm.w", "norm.w")]
    with pytest.raises(
        ValueError,
        match=r"tree\['norm'\]\['w'\] \(named 'norm.w'\) is a target of key rules "
        r"'a.\{n\}.w' -> '\{n\}.w' and 'b.norm.w'",
    ):
        tc.state_dict({"norm": {"w": jnp.ones(2)}, "x": {"w": jnp.ones(2)}}, rules=rules)
    limited = [("a.{n:x|y}.w", "{n}.w"), ("b.norm.w", "norm.w")]
    out = tc.state_dict({"norm": {"w": jnp.ones(2)}, "x": {"w": jnp.ones(2)}}, rules=limited)
    assert list(out) == ["a.x.w", "b.norm.w"]


def test_a_split_rule_needs_all_its_targets_to_export():
    rule = ("qkv", ["q", "k"], lambda w: jnp.split(w, 2))
    with pytest.raises(
        ValueError,
        match=r"writes \['qkv'\] from all its targets; "
        r"the model has \[\"tree\['q'\]\"\] but not \['k'\]",
    ):
        tc.state_dict({"q": jnp.ones(2)}, rules=[rule])


def test_a_failed_export_leaves_the_file_as_it_was(tmp_path):
    path = tmp_path / "m.safetensors"
    tc.save(path, {"w": jnp.ones(2)})
    before = path.read_bytes()
    with pytest.raises(ValueError, match="cannot be inverted"):
        tc.save(path, {"w": jnp.ones(2)}, rules=[("fc", "w", lambda w: w * 2)])
    assert path.read_bytes() == before


def test_an_export_writes_the_metadata_it_is_given_and_no_treeclass_document(tmp_path):
    from safetensors import safe_open

    path = tmp_path / "m.safetensors"
    tc.save(
        path, {"w": jnp.ones(2), "act": "relu"}, rules=[("fc.w", "w")], metadata={"format": "pt"}
    )
    with safe_open(str(path), "np") as f:
        assert f.metadata() == {"format": "pt"} and list(f.keys()) == ["fc.w"]
    with pytest.raises(ValueError, match="metadata= takes a dict of strings"):
        tc.save(path, {"w": jnp.ones(2)}, metadata={"format": 1})


def test_a_sharded_export_is_a_sharded_foreign_checkpoint(gpt2_file, tmp_path):
    path, tensors = gpt2_file
    model = tc.load(path, stacked_template(), rules=RULES)
    index = tmp_path / "model.safetensors.index.json"
    tc.save(index, model, rules=RULES, max_shard_size="1kB")
    names = json.loads(index.read_text())["weight_map"]
    assert set(names) == set(tensors) and len(set(names.values())) > 1
    assert tc.is_tree_equal(tc.load(index, stacked_template(), rules=RULES), model)


def test_a_rule_taking_a_stacked_leaf_whole_exports_it_whole():
    class Block(tc.TreeClass):
        w: jax.Array

    model = {"blocks": tc.Stacked.from_blocks([Block(jnp.full(2, float(i))) for i in range(3)])}
    assert list(tc.state_dict(model, rules=[("stack.w", "blocks.w")])) == ["stack.w"]
    per_layer = tc.state_dict(model, rules=[("h.{i}.w", "blocks[{i}].w")])
    assert list(per_layer) == ["h.0.w", "h.1.w", "h.2.w"]
    assert per_layer["h.2.w"].tolist() == [2.0, 2.0]
    assert list(tc.state_dict(model, rules=[])) == ["blocks.0.w", "blocks.1.w", "blocks.2.w"]


@settings(max_examples=25, deadline=None)
@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
    moves=st.lists(st.sampled_from(["T", "flip", "roll", "double"]), min_size=1, max_size=3),
)
def test_export_undoes_any_chain_of_element_moves(shape, moves):
    def transform(w):
        for move in moves:
            if move == "T":
                w = w.T
            elif move == "flip":
                w = w[::-1]
            elif move == "roll":
                w = jnp.moveaxis(w, 0, -1)
            else:
                w = jnp.concatenate([w, w])[: w.shape[0]]  # a copy of a part, moved back
        return w

    w = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) - 3.5
    rule = ("fc.w", "w", transform)
    model = tc.from_state_dict({"w": jnp.zeros(transform(w).shape)}, {"fc": {"w": w}}, rules=[rule])
    back = tc.state_dict(model, rules=[rule])["fc.w"]
    assert back.shape == shape and back.tobytes() == w.tobytes()


def test_a_stack_of_numpy_arrays_is_assembled_on_the_host_in_its_dtype(tmp_path):
    class Block(tc.TreeClass):
        w: Any

    tensors = {f"h.{i}.w": np.full(3, i + 0.1, np.float64) for i in range(4)}
    save_file(tensors, str(tmp_path / "m.safetensors"))
    like = {"blocks": tc.Stacked.from_blocks([Block(np.zeros(3))] * 4)}
    model = tc.load(tmp_path / "m.safetensors", like, rules=[("h.{i}.w", "blocks[{i}].w")])
    leaf = model["blocks"].tree.w
    assert isinstance(leaf, np.ndarray) and leaf.dtype == np.float64
    assert leaf[:, 0].tolist() == [0.1, 1.1, 2.1, 3.1]  # exact: never through float32


def test_a_prng_key_exports_through_a_rule_with_both_directions(tmp_path):
    model = {"w": jnp.ones(2), "key": jax.random.key(3)}
    with pytest.raises(ValueError, match=r"tree\['key'\] is a PRNG key array"):
        tc.state_dict(model, rules=[])
    with pytest.raises(ValueError, match="give the rule both directions"):
        tc.state_dict(model, rules=[("rng", "key")])
    rule = ("rng", "key", jax.random.wrap_key_data, jax.random.key_data)
    path = tmp_path / "m.safetensors"
    tc.save(path, model, rules=[rule])
    assert load_file(str(path))["rng"].dtype == np.uint32
    restored = tc.load(path, model, rules=[rule])
    assert tc.is_tree_equal(restored, model)


def test_the_one_missing_and_the_one_unexpected_tensor_of_a_shape_suggest_the_rename(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"fc.weight": np.ones((2, 3), np.float32), "fc.bias": np.ones(3, np.float32)}, path)
    like = {"fc": {"kernel": jnp.zeros((2, 3)), "bias": jnp.zeros(3)}}
    message = _refusal(path, like)
    assert "rules=[('fc.weight', 'fc.kernel')]" in message
    assert 'missing="keep"' not in message and 'unexpected="ignore"' not in message
    # two of a shape on each side: no guess, and the loosening says what it leaves out
    save_file({"a.x": np.ones(2, np.float32), "a.y": np.ones(2, np.float32)}, path)
    message = _refusal(path, {"b": jnp.zeros(2), "c": jnp.zeros(2)})
    assert "renamed paths" not in message
    assert 'missing="keep") (2 leaves left unrestored)' in message
    assert 'unexpected="ignore") (2 tensors of the file left unread)' in message


def test_a_close_name_of_another_shape_or_role_is_never_suggested(tmp_path):
    path = tmp_path / "m.safetensors"
    tensors = {"attn.LayerNorm.weight": np.ones(4, np.float32), "attn.q.weights": np.ones(3)}
    save_file({k: np.asarray(v, np.float32) for k, v in tensors.items()}, path)
    like = {"attn": {"q": {"weight": jnp.zeros(4)}, "norm": {"scale": jnp.zeros(4)}}}
    message = _refusal(path, like)
    assert "rules=[('attn.LayerNorm.weight', 'attn.norm.scale')]" in message
    assert "'attn.LayerNorm.weight', 'attn.q.weight'" not in message  # another role
    assert "'attn.q.weights', 'attn.q.weight'" not in message  # another shape


def test_one_shard_of_an_indexed_folder_suggests_loading_its_index(tmp_path):
    model = {"a": jnp.ones(64), "b": jnp.ones(64)}
    index = tmp_path / "model.safetensors.index.json"
    tc.save(index, model, max_shard_size="300B")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[0]
    with pytest.raises(ValueError) as info:
        tc.load(shard, model)
    assert f"is one shard of the indexed folder whose index is {index}: load the index" in str(
        info.value
    )
    assert tc.is_tree_equal(tc.load(index, model), model)


@pytest.mark.parametrize("entry", ["load", "state_dict", "save"])
def test_a_shadowed_rule_is_refused_by_every_entry_point_and_writes_nothing(tmp_path, entry):
    from safetensors.numpy import save_file

    one = np.ones(2, np.float32)
    path = tmp_path / "m.safetensors"
    save_file({"layers.0.q.weight": one, "layers.0.k.weight": one}, str(path))
    like = {"layers": [{"q": jnp.zeros(2), "k": {"weight": jnp.zeros(2)}}]}
    shadowed = [
        ("layers.{i}.{rest*}", "layers[{i}].{rest}"),
        ("layers.{i}.q.weight", "layers[{i}].q", lambda w: w * 2, lambda w: w / 2),
    ]
    out = tmp_path / "out.safetensors"
    run = {
        "load": lambda: tc.load(path, like, rules=shadowed),
        "state_dict": lambda: tc.state_dict(like, rules=shadowed),
        "save": lambda: tc.save(out, like, rules=shadowed),
    }[entry]
    with pytest.raises(ValueError, match=r"layers\.\{i\}\.q\.weight"):
        run()
    assert not out.exists()
    assert like["layers"][0]["q"].tolist() == [0.0, 0.0]  # the input is left as it was
