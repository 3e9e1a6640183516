"""Weights written by HuggingFace `transformers` load through key rules and match its logits.

The fixtures in tests/fixtures/hf_*/ were written by `transformers` itself (see
tests/fixtures/make_hf_fixtures.py, run by hand); these tests need neither torch nor
transformers. The models are TreeClasses written here (GPT-2 and Llama from plain arrays,
BERT from `tc.nn` layers); the rule tables are the ones the checkpoints guide shows, which
the last test checks.
"""

from __future__ import annotations

import ast
import json
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import reference_tol
from safetensors import safe_open
from safetensors.numpy import load_file

import treeclass as tc

# references are compared at tight tolerances: full-precision matrix products everywhere
pytestmark = pytest.mark.usefixtures("highest_precision")

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
GUIDE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "guides" / "checkpoints.md"


class Linear(tc.TreeClass):
    weight: jax.Array  # [in, out]
    bias: jax.Array

    def __call__(self, x):
        return x @ self.weight + self.bias


class LayerNorm(tc.TreeClass):
    weight: jax.Array
    bias: jax.Array
    eps: float = tc.field(default=1e-5, static=True)

    def __call__(self, x):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + self.eps) * self.weight + self.bias


def _linear(n_in, n_out):
    return Linear(jnp.zeros((n_in, n_out)), jnp.zeros(n_out))


def _norm(n, eps):
    return LayerNorm(jnp.zeros(n), jnp.zeros(n), eps)


def _attention(q, k, v, n_head, causal):
    def heads(x):
        return x.reshape(*x.shape[:-1], n_head, -1).swapaxes(-2, -3)

    q, k, v = heads(q), heads(k), heads(v)
    scores = q @ k.swapaxes(-1, -2) / jnp.sqrt(q.shape[-1])
    if causal:
        n = scores.shape[-1]
        scores = jnp.where(jnp.tril(jnp.ones((n, n), bool)), scores, -jnp.inf)
    out = jax.nn.softmax(scores, axis=-1) @ v
    return out.swapaxes(-2, -3).reshape(*out.shape[:-3], out.shape[-2], -1)


def _reference(name):
    folder = FIXTURES / f"hf_{name}"
    config = json.loads((folder / "config.json").read_text())
    reference = np.load(folder / "reference.npz")
    return folder / "model.safetensors", config, reference["input_ids"], reference["logits"]


# -- GPT-2: Conv1D weights are [in, out]; c_attn holds q | k | v along its columns --------------


class GPT2Block(tc.TreeClass):
    ln_1: LayerNorm
    q: Linear
    k: Linear
    v: Linear
    proj: Linear
    ln_2: LayerNorm
    up: Linear
    down: Linear
    n_head: int = tc.field(static=True)

    def __call__(self, x):
        h = self.ln_1(x)
        x = x + self.proj(_attention(self.q(h), self.k(h), self.v(h), self.n_head, True))
        return x + self.down(jax.nn.gelu(self.up(self.ln_2(x)), approximate=True))


class GPT2(tc.TreeClass):
    wte: jax.Array
    wpe: jax.Array
    blocks: list
    ln_f: LayerNorm

    def __call__(self, ids):
        x = self.wte[ids] + self.wpe[: ids.shape[-1]]
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.T  # the output layer is tied to the embedding


def gpt2_template(config):
    d, eps = config["n_embd"], config["layer_norm_epsilon"]
    inner = config["n_inner"] or 4 * d
    block = GPT2Block(
        *(_norm(d, eps), _linear(d, d), _linear(d, d), _linear(d, d), _linear(d, d)),
        *(_norm(d, eps), _linear(d, inner), _linear(inner, d)),
        n_head=config["n_head"],
    )
    return GPT2(
        jnp.zeros((config["vocab_size"], d)),
        jnp.zeros((config["n_positions"], d)),
        [block] * config["n_layer"],
        _norm(d, eps),
    )


GPT2_RULES = [
    ("transformer.wte.weight", "wte"),
    ("transformer.wpe.weight", "wpe"),
    ("transformer.ln_f.{p}", "ln_f.{p}"),
    ("transformer.h.{i}.ln_{n}.{p}", "blocks[{i}].ln_{n}.{p}"),
    (
        "transformer.h.{i}.attn.c_attn.{p}",
        ["blocks[{i}].q.{p}", "blocks[{i}].k.{p}", "blocks[{i}].v.{p}"],
        lambda w: jnp.split(w, 3, axis=-1),  # weight [in, 3 out] and bias [3 out] alike
    ),
    ("transformer.h.{i}.attn.c_proj.{p}", "blocks[{i}].proj.{p}"),
    ("transformer.h.{i}.mlp.c_fc.{p}", "blocks[{i}].up.{p}"),
    ("transformer.h.{i}.mlp.c_proj.{p}", "blocks[{i}].down.{p}"),
]


def test_gpt2_written_by_transformers_loads_through_rules_and_matches_its_logits():
    path, config, ids, logits = _reference("gpt2")
    report = tc.load(path, gpt2_template(config), rules=GPT2_RULES, dry_run=True)
    assert report.messages == () and not report.unexpected and not report.missing
    model = tc.load(path, gpt2_template(config), rules=GPT2_RULES)
    np.testing.assert_allclose(jax.jit(jax.vmap(model))(ids), logits, **reference_tol())


def test_gpt2_with_a_transposed_square_projection_loads_silently_but_misses_the_logits():
    path, config, ids, logits = _reference("gpt2")
    wrong = [  # the guide's old table: the square attention output transposed
        (*rule[:2], lambda w: w.T) if rule[0].endswith("attn.c_proj.{p}") else rule
        for rule in GPT2_RULES
    ]
    model = tc.load(path, gpt2_template(config), rules=wrong)  # [16, 16]: no shape error
    assert np.abs(np.asarray(jax.vmap(model)(ids)) - logits).max() > 1e-2


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_hf_fixtures_are_small(name):
    folder = FIXTURES / f"hf_{name}"
    assert sum(p.stat().st_size for p in folder.iterdir()) < 100_000


# -- Llama: nn.Linear weights are [out, in]; q and k rotate in halves (rotate_half) --------------


class RMSNorm(tc.TreeClass):
    weight: jax.Array
    eps: float = tc.field(static=True)

    def __call__(self, x):
        return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + self.eps) * self.weight


def _rotary(x, theta):
    """HF Llama's rotary embedding of `x` `[heads, tokens, head_dim]`: halves, not pairs."""
    half = x.shape[-1] // 2
    inv_freq = 1.0 / theta ** (jnp.arange(0, 2 * half, 2) / (2 * half))
    angles = jnp.arange(x.shape[-2])[:, None] * inv_freq
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


class LlamaBlock(tc.TreeClass):
    input_norm: RMSNorm
    q: jax.Array  # [in, out], as JAX multiplies
    k: jax.Array
    v: jax.Array
    o: jax.Array
    post_norm: RMSNorm
    gate: jax.Array
    up: jax.Array
    down: jax.Array
    n_head: int = tc.field(static=True)
    n_kv_head: int = tc.field(static=True)
    theta: float = tc.field(static=True)

    def __call__(self, x):
        h = self.input_norm(x)

        def heads(y, n):
            return y.reshape(y.shape[0], n, -1).swapaxes(0, 1)

        q = _rotary(heads(h @ self.q, self.n_head), self.theta)
        k = _rotary(heads(h @ self.k, self.n_kv_head), self.theta)
        v = heads(h @ self.v, self.n_kv_head)
        group = self.n_head // self.n_kv_head  # each key/value head serves `group` queries
        k, v = jnp.repeat(k, group, axis=0), jnp.repeat(v, group, axis=0)
        scores = q @ k.swapaxes(-1, -2) / jnp.sqrt(q.shape[-1])
        n = scores.shape[-1]
        scores = jnp.where(jnp.tril(jnp.ones((n, n), bool)), scores, -jnp.inf)
        attended = (jax.nn.softmax(scores, axis=-1) @ v).swapaxes(0, 1).reshape(n, -1)
        x = x + attended @ self.o
        h = self.post_norm(x)
        return x + (jax.nn.silu(h @ self.gate) * (h @ self.up)) @ self.down


class Llama(tc.TreeClass):
    embed: jax.Array
    layers: list
    norm: RMSNorm
    head: jax.Array  # [in, out]

    def __call__(self, ids):
        x = self.embed[ids]
        for layer in self.layers:
            x = layer(x)
        return self.norm(x) @ self.head


def llama_template(config):
    d, eps = config["hidden_size"], config["rms_norm_eps"]
    head_dim = config["head_dim"]
    n_head, n_kv = config["num_attention_heads"], config["num_key_value_heads"]
    inner = config["intermediate_size"]
    layer = LlamaBlock(
        RMSNorm(jnp.zeros(d), eps),
        *(jnp.zeros((d, n_head * head_dim)), jnp.zeros((d, n_kv * head_dim))),
        *(jnp.zeros((d, n_kv * head_dim)), jnp.zeros((n_head * head_dim, d))),
        RMSNorm(jnp.zeros(d), eps),
        *(jnp.zeros((d, inner)), jnp.zeros((d, inner)), jnp.zeros((inner, d))),
        n_head=n_head,
        n_kv_head=n_kv,
        theta=config["rope_parameters"]["rope_theta"],
    )
    return Llama(
        jnp.zeros((config["vocab_size"], d)),
        [layer] * config["num_hidden_layers"],
        RMSNorm(jnp.zeros(d), eps),
        jnp.zeros((d, config["vocab_size"])),
    )


def transpose(w):
    return w.T


LLAMA_RULES = [
    ("model.embed_tokens.weight", "embed"),
    ("model.norm.weight", "norm.weight"),
    ("lm_head.weight", "head", transpose),
    ("model.layers.{i}.input_layernorm.weight", "layers[{i}].input_norm.weight"),
    ("model.layers.{i}.post_attention_layernorm.weight", "layers[{i}].post_norm.weight"),
    ("model.layers.{i}.self_attn.{n:q|k|v|o}_proj.weight", "layers[{i}].{n}", transpose),
    ("model.layers.{i}.mlp.{n:gate|up|down}_proj.weight", "layers[{i}].{n}", transpose),
]


def test_llama_written_by_transformers_loads_through_rules_and_matches_its_logits():
    path, config, ids, logits = _reference("llama")
    report = tc.load(path, llama_template(config), rules=LLAMA_RULES, dry_run=True)
    assert report.messages == () and not report.unexpected and not report.missing
    model = tc.load(path, llama_template(config), rules=LLAMA_RULES)
    np.testing.assert_allclose(jax.jit(jax.vmap(model))(ids), logits, **reference_tol())


# -- BERT: built from tc.nn layers, which keep PyTorch's [out, in] layout: the rules only rename --


class BertLayer(tc.TreeClass):  # post-LN: each residual sum is normalised
    attention: tc.nn.MultiHeadAttention
    attention_norm: tc.nn.LayerNorm
    up: tc.nn.Linear
    down: tc.nn.Linear
    output_norm: tc.nn.LayerNorm

    def __call__(self, x, mask):
        x = self.attention_norm(x + self.attention(x, mask=mask))
        return self.output_norm(x + self.down(jax.nn.gelu(self.up(x), approximate=False)))


class Bert(tc.TreeClass):
    word: tc.nn.Embed
    position: tc.nn.Embed
    token_type: tc.nn.Embed
    embed_norm: tc.nn.LayerNorm
    layers: list
    pooler: tc.nn.Linear

    def __call__(self, ids, valid, token_types):
        """The last hidden state and the pooled output, for `[batch, seq]` inputs."""
        positions = jnp.arange(ids.shape[-1])
        x = self.word(ids) + self.position(positions) + self.token_type(token_types)
        x = self.embed_norm(x)
        mask = valid.astype(bool)[:, None, None, :]  # every query attends to real tokens
        for layer in self.layers:
            x = layer(x, mask)
        return x, jnp.tanh(self.pooler(x[:, 0]))


def bert_template(config):
    d, eps, n_head = config["hidden_size"], config["layer_norm_eps"], config["num_attention_heads"]
    inner = config["intermediate_size"]
    keys = iter(jax.random.split(jax.random.key(0), 8))  # any values: the file replaces them
    layer = BertLayer(
        tc.nn.MultiHeadAttention(d, n_head, use_bias=True, key=next(keys)),
        tc.nn.LayerNorm(d, eps=eps),
        tc.nn.Linear(d, inner, key=next(keys)),
        tc.nn.Linear(inner, d, key=next(keys)),
        tc.nn.LayerNorm(d, eps=eps),
    )
    return Bert(
        tc.nn.Embed(config["vocab_size"], d, key=next(keys)),
        tc.nn.Embed(config["max_position_embeddings"], d, key=next(keys)),
        tc.nn.Embed(config["type_vocab_size"], d, key=next(keys)),
        tc.nn.LayerNorm(d, eps=eps),
        [layer] * config["num_hidden_layers"],
        tc.nn.Linear(d, d, key=next(keys)),
    )


BERT_RULES = [
    ("embeddings.{kind:word|position|token_type}_embeddings.weight", "{kind}.weight"),
    ("embeddings.LayerNorm.{p}", "embed_norm.{p}"),
    ("encoder.layer.{i}.attention.self.query.{p}", "layers[{i}].attention.q_proj.{p}"),
    ("encoder.layer.{i}.attention.self.key.{p}", "layers[{i}].attention.k_proj.{p}"),
    ("encoder.layer.{i}.attention.self.value.{p}", "layers[{i}].attention.v_proj.{p}"),
    ("encoder.layer.{i}.attention.output.dense.{p}", "layers[{i}].attention.o_proj.{p}"),
    ("encoder.layer.{i}.attention.output.LayerNorm.{p}", "layers[{i}].attention_norm.{p}"),
    ("encoder.layer.{i}.intermediate.dense.{p}", "layers[{i}].up.{p}"),
    ("encoder.layer.{i}.output.dense.{p}", "layers[{i}].down.{p}"),
    ("encoder.layer.{i}.output.LayerNorm.{p}", "layers[{i}].output_norm.{p}"),
    ("pooler.dense.{p}", "pooler.{p}"),
]


def _bert_reference():
    folder = FIXTURES / "hf_bert"
    config = json.loads((folder / "config.json").read_text())
    reference = dict(np.load(folder / "reference.npz"))
    inputs = [reference[k] for k in ("input_ids", "attention_mask", "token_type_ids")]
    outputs = reference["last_hidden_state"], reference["pooler_output"]
    return folder / "model.safetensors", config, inputs, outputs


def test_bert_written_by_transformers_loads_through_renames_and_matches_its_outputs():
    path, config, inputs, (hidden, pooled) = _bert_reference()
    assert inputs[1].min() == 0 and inputs[2].max() == 1  # padding and two segments
    report = tc.load(path, bert_template(config), rules=BERT_RULES, dry_run=True)
    assert report.messages == () and not report.unexpected and not report.missing
    model = tc.load(path, bert_template(config), rules=BERT_RULES)
    ours_hidden, ours_pooled = jax.jit(Bert.__call__)(model, *inputs)
    # padded positions too: their queries still attend to the real tokens, as in BERT
    np.testing.assert_allclose(ours_hidden, hidden, **reference_tol())
    np.testing.assert_allclose(ours_pooled, pooled, **reference_tol())


def test_bert_padding_mask_matters_for_the_reference():
    path, config, (ids, valid, types), (hidden, _) = _bert_reference()
    model = tc.load(path, bert_template(config), rules=BERT_RULES)
    unmasked, _ = model(ids, np.ones_like(valid), types)
    assert np.abs(np.asarray(unmasked[1]) - hidden[1]).max() > 1e-2


def test_bert_with_a_transposed_square_projection_loads_silently_but_misses_the_outputs():
    path, config, inputs, (hidden, _) = _bert_reference()
    wrong = [  # a transform that a tc.nn layer does not need, on a square [16, 16] weight
        (*rule, transpose) if "attention.output.dense" in rule[0] else rule for rule in BERT_RULES
    ]
    model = tc.load(path, bert_template(config), rules=wrong)  # no shape error
    assert np.abs(np.asarray(model(*inputs)[0]) - hidden).max() > 1e-2


# -- the same tables load stacked models and export, both byte for byte ------------------------


def _stacked_gpt2(config):
    t = gpt2_template(config)
    return GPT2(t.wte, t.wpe, tc.Stacked.from_blocks(t.blocks), t.ln_f)


def _stacked_llama(config):
    t = llama_template(config)
    return Llama(t.embed, tc.Stacked.from_blocks(t.layers), t.norm, t.head)


def _periodic_llama(config):  # a pattern of one layer, repeated twice
    t = llama_template(config)
    return Llama(t.embed, tc.Periodic.from_layers(t.layers, 1), t.norm, t.head)


def _pattern_llama(config):  # a pattern of two layers, once
    t = llama_template(config)
    return Llama(t.embed, tc.Periodic.from_layers(t.layers, 2), t.norm, t.head)


def _stacked_bert(config):
    t = bert_template(config)
    return Bert(
        t.word, t.position, t.token_type, t.embed_norm, tc.Stacked.from_blocks(t.layers), t.pooler
    )


CASES = {
    "gpt2": (GPT2_RULES, [gpt2_template, _stacked_gpt2]),
    "llama": (LLAMA_RULES, [llama_template, _stacked_llama, _periodic_llama, _pattern_llama]),
    "bert": (BERT_RULES, [bert_template, _stacked_bert]),
}


def _cases():
    for name, (rules, makers) in CASES.items():
        for make in makers:
            yield pytest.param(name, rules, make, id=f"{name}-{make.__name__}")


def _outputs(name, model):
    if name == "bert":
        _, _, inputs, expected = _bert_reference()
        return jax.jit(Bert.__call__)(model, *inputs), expected
    _, _, ids, logits = _reference(name)
    return jax.jit(jax.vmap(model))(ids), logits


@pytest.mark.parametrize("name, rules, make", list(_cases()))
def test_the_same_rules_load_every_layout_of_the_model_and_match_the_reference(name, rules, make):
    folder = FIXTURES / f"hf_{name}"
    config = json.loads((folder / "config.json").read_text())
    model = tc.load(folder / "model.safetensors", make(config), rules=rules)
    ours, expected = _outputs(name, model)
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(expected)):
        np.testing.assert_allclose(a, b, **reference_tol())


@pytest.mark.parametrize("name, rules, make", list(_cases()))
def test_export_through_the_same_rules_gives_the_transformers_file_back(
    name, rules, make, tmp_path
):
    folder = FIXTURES / f"hf_{name}"
    config = json.loads((folder / "config.json").read_text())
    original = load_file(folder / "model.safetensors")
    model = tc.load(folder / "model.safetensors", make(config), rules=rules)
    tc.save(tmp_path / "model.safetensors", model, rules=rules, metadata={"format": "pt"})
    written = load_file(tmp_path / "model.safetensors")
    with safe_open(str(tmp_path / "model.safetensors"), "np") as f:
        assert f.metadata() == {"format": "pt"}  # where transformers reads it
    assert sorted(written) == sorted(original)  # GPT-2's tied lm_head stays out, as HF writes it
    for key, array in original.items():
        assert (written[key].dtype, written[key].shape) == (array.dtype, array.shape), key
        assert written[key].tobytes() == array.tobytes(), key


# -- an export that transformers loads (checked by the generator, which records its outputs) ----

EXPORTS = {  # the stacked layouts: their layers leave as per-layer names
    "gpt2": (GPT2_RULES, _stacked_gpt2),
    "llama": (LLAMA_RULES, _periodic_llama),
    "bert": (BERT_RULES, _stacked_bert),
}


def changed_model(name):
    """The fixture's model, loaded into a stacked layout and changed in JAX: its layers in
    reverse order and its token embedding halved (exact operations, so the export is the
    same bytes everywhere). tests/fixtures/export_hf_fixtures.py exports it."""
    rules, make = EXPORTS[name]
    folder = FIXTURES / f"hf_{name}"
    config = json.loads((folder / "config.json").read_text())
    model = tc.load(folder / "model.safetensors", make(config), rules=rules)
    stack = {"gpt2": "blocks", "llama": "layers", "bert": "layers"}[name]
    model = model.at[stack].set(jax.tree_util.tree_map(lambda x: x[::-1], getattr(model, stack)))
    embedding = {"gpt2": "wte", "llama": "embed", "bert": "word"}[name]
    if name == "bert":
        return model.at[embedding].set(model.word.at["weight"].apply(lambda w: w * 0.5))
    return model.at[embedding].apply(lambda w: w * 0.5)


def changed_outputs(name):
    """What the changed model computes for the fixture's inputs (BERT: two arrays)."""
    ours, _ = _outputs(name, changed_model(name))
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(ours)]


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_the_recorded_export_is_what_export_writes_now(name, tmp_path):
    rules, _ = EXPORTS[name]
    tc.save(tmp_path / "model.safetensors", changed_model(name), rules=rules)
    written = load_file(tmp_path / "model.safetensors")
    recorded = load_file(FIXTURES / f"hf_{name}" / "export" / "model.safetensors")
    assert sorted(written) == sorted(recorded)
    assert all(written[k].tobytes() == recorded[k].tobytes() for k in recorded)


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_transformers_loaded_the_export_and_computed_what_the_changed_model_computes(name):
    recorded = np.load(FIXTURES / f"hf_{name}" / "export" / "transformers.npz")
    assert recorded["missing"].size == 0 and recorded["unexpected"].size == 0
    reference = (
        _bert_reference()[3] if name == "bert" else (_reference(name)[3],)
    )  # what transformers computed from the fixture itself
    for k, ours in enumerate(changed_outputs(name)):
        theirs = recorded[f"output_{k}"]
        np.testing.assert_allclose(ours, theirs, **reference_tol())
        assert np.abs(reference[k] - theirs).max() > 1e-2  # the change shows in the export


# -- the checkpoints guide shows these tables as they are here ---------------------------------


def _definitions(names):
    """The source text of this module's top-level definitions of `names`."""
    source = pathlib.Path(__file__).read_text()
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        elif isinstance(node, ast.FunctionDef):
            name = node.name
        else:
            continue
        if name in names:
            found[name] = ast.get_source_segment(source, node)
    return found


@pytest.mark.parametrize("name", ["GPT2_RULES", "transpose", "LLAMA_RULES", "BERT_RULES"])
def test_the_checkpoints_guide_shows_the_tables_these_tests_run(name):
    blocks = re.findall(r"^```python\n(.*?)^```", GUIDE.read_text(), re.MULTILINE | re.DOTALL)
    definition = _definitions({name})[name]
    assert any(definition in block for block in blocks), (
        f"docs/guides/checkpoints.md should show `{name}` exactly as {__name__} defines it"
    )


# -- what a load without rules suggests, on the files transformers writes ----------------------


def _suggested(message):
    """Every key rule a refusal suggests, as rules (`lambda` text run)."""
    found = []
    for table in re.findall(r"rules=(\[.*?\)\])", message):
        found += eval(table, {"jnp": jnp})  # the text is the library's own suggestion
    return found


def test_a_stacked_llama_loaded_without_rules_is_suggested_rules_that_load_it_right():
    folder = FIXTURES / "hf_llama"
    config = json.loads((folder / "config.json").read_text())
    with pytest.raises(ValueError) as info:
        tc.load(folder / "model.safetensors", _stacked_llama(config))
    message = str(info.value)
    assert 'missing="keep"' not in message and 'unexpected="ignore"' not in message
    rules = _suggested(message)
    assert ("model.layers.{i}.self_attn.q_proj.weight", "layers[{i}].q") in [r[:2] for r in rules]
    model = tc.load(folder / "model.safetensors", _stacked_llama(config), rules=rules)
    ours, expected = _outputs("llama", model)
    np.testing.assert_allclose(ours, expected, **reference_tol())


def test_a_bert_file_without_rules_pairs_only_tensors_that_fit_and_no_table_as_a_stack():
    folder = FIXTURES / "hf_bert"
    config = json.loads((folder / "config.json").read_text())
    template = bert_template(config)
    with pytest.raises(ValueError) as info:
        tc.load(folder / "model.safetensors", template)
    message = str(info.value)
    assert "a stack of" not in message  # the 2-row token-type table is no stack
    file = load_file(folder / "model.safetensors")
    shapes = tc.state_dict(template, rules=[])
    rules = _suggested(message)
    assert ("embeddings.token_type_embeddings.weight", "token_type.weight") in rules
    for source, target, *_ in rules:
        for i in range(config["num_hidden_layers"]):
            name, path = source.replace("{i}", str(i)), target.replace("{i}", str(i))
            assert file[name].shape == shapes[path].shape, (source, target)
        assert ("LayerNorm" in source) == ("norm" in target), (source, target)
    # what no rule fits is loosened, with the count it leaves unrestored
    assert re.search(r'missing="keep"\) \(\d+ leaves left unrestored\)', message)
