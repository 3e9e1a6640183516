"""Seven model families, each a configuration of `tc.nn` blocks plus one rule table, load
the files `transformers` wrote to the outputs it computed and export them back byte for
byte.

The fixtures in tests/fixtures/hf_<family>/ were written by `transformers` itself
(tests/fixtures/make_hf_fixtures.py, run by hand); these tests need neither torch nor
transformers. The builders and tables below are the ones docs/guides/families.md shows,
which the last test checks, word for word.
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

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "guides" / "families.md"

nn = tc.nn


# -- the models: blocks from tc.nn, stacked; the page shows these definitions -------------------


class CausalLM(tc.TreeClass):
    embed_tokens: nn.Embed
    layers: tc.Stacked  # the decoder blocks, called in one scan
    norm: nn.RMSNorm | nn.LayerNorm
    lm_head: nn.Linear | None  # None: the output layer is the embeddings (tied)

    def __call__(self, ids):
        x = self.norm(self.layers(self.embed_tokens(ids)))
        return self.embed_tokens.attend(x) if self.lm_head is None else self.lm_head(x)


def causal_lm(block, *, vocab, width, layers, norm, tied=False, scale=None, key, **dtypes):
    k_embed, k_layers, k_head = jax.random.split(key, 3)
    return CausalLM(
        nn.Embed(vocab, width, scale=scale, key=k_embed, **dtypes),
        tc.Stacked.from_init(block, jax.random.split(k_layers, layers)),
        norm,
        None if tied else nn.Linear(width, vocab, use_bias=False, key=k_head, **dtypes),
    )


BF16 = dict(param_dtype=jnp.bfloat16, dtype=jnp.float32)  # stored in bf16, computed in f32


def llama(key):
    def block(k):
        return nn.DecoderBlock(16, 4, 32, num_kv_heads=2, rope_theta=1e4, norm_eps=1e-6, key=k)

    norm = nn.RMSNorm(16, eps=1e-6)
    return causal_lm(block, vocab=64, width=16, layers=2, norm=norm, key=key)


LLAMA_RULES = [
    ("model.embed_tokens.weight", "embed_tokens.weight"),
    ("model.layers.{i}.{rest*}", "layers[{i}].{rest}"),  # the block's names are Llama's
    ("model.norm.weight", "norm.weight"),
    ("lm_head.weight", "lm_head.weight"),
]


def qwen2(key):
    def block(k):
        return nn.DecoderBlock(
            16,
            num_heads=4,
            hidden_features=32,
            num_kv_heads=2,
            rope_theta=1e6,
            norm_eps=1e-6,
            use_qkv_bias=True,  # q, k and v have biases, o has none
            **BF16,
            key=k,
        )

    norm = nn.RMSNorm(16, eps=1e-6, **BF16)
    return causal_lm(block, vocab=64, width=16, layers=2, norm=norm, key=key, **BF16)


QWEN2_RULES = LLAMA_RULES  # Llama's names, the biases included by {rest*}


def mistral(key):
    def block(k):
        return nn.DecoderBlock(
            16,
            num_heads=4,
            hidden_features=32,
            num_kv_heads=2,
            rope_theta=1e6,
            norm_eps=1e-6,
            sliding_window=3,  # each token sees itself and the 2 before
            key=k,
        )

    norm = nn.RMSNorm(16, eps=1e-6)
    return causal_lm(block, vocab=64, width=16, layers=2, norm=norm, key=key)


MISTRAL_RULES = LLAMA_RULES


def gemma(key):
    def block(k):
        return nn.DecoderBlock(
            16,
            num_heads=4,
            hidden_features=32,
            num_kv_heads=1,  # multi-query
            head_dim=8,
            rope_theta=1e4,
            norm_eps=1e-6,
            norm_weight_offset=1.0,  # the norms scale by (1 + w)
            activation=jax.nn.gelu,  # the tanh approximation, gated
            **BF16,
            key=k,
        )

    norm = nn.RMSNorm(16, eps=1e-6, weight_offset=1.0, **BF16)
    return causal_lm(
        block, vocab=64, width=16, layers=2, norm=norm, tied=True, scale=16**0.5, key=key, **BF16
    )


GEMMA_RULES = LLAMA_RULES[:3]  # the output layer is tied: no lm_head in the file


def gpt_neox(key):
    def block(k):
        return nn.DecoderBlock(
            16,
            num_heads=4,
            hidden_features=32,
            rope_theta=1e4,
            rope_dim=2,  # rotary on the first 2 of each head's 4 dimensions
            norm="layer",
            gated=False,
            activation=nn.gelu_exact,
            use_qkv_bias=True,
            use_out_bias=True,
            use_mlp_bias=True,
            parallel_residual=True,
            key=k,
        )

    norm = nn.LayerNorm(16)
    return causal_lm(block, vocab=64, width=16, layers=2, norm=norm, key=key)


def split_heads(w, heads=4):
    """GPT-NeoX's fused `query_key_value` is `[heads, (q, k, v), head_dim, ...]`."""
    fused = w.reshape(heads, 3, -1, *w.shape[1:])
    return tuple(fused[:, j].reshape(-1, *w.shape[1:]) for j in range(3))


GPT_NEOX_RULES = [
    ("gpt_neox.embed_in.weight", "embed_tokens.weight"),
    (
        "gpt_neox.layers.{i}.attention.query_key_value.{p}",
        [f"layers[{{i}}].self_attn.{n}_proj.{{p}}" for n in "qkv"],
        split_heads,
    ),
    ("gpt_neox.layers.{i}.attention.dense.{p}", "layers[{i}].self_attn.o_proj.{p}"),
    ("gpt_neox.layers.{i}.mlp.dense_h_to_4h.{p}", "layers[{i}].mlp.up_proj.{p}"),
    ("gpt_neox.layers.{i}.mlp.dense_4h_to_h.{p}", "layers[{i}].mlp.down_proj.{p}"),
    ("gpt_neox.layers.{i}.{n}_layernorm.{p}", "layers[{i}].{n}_layernorm.{p}"),
    ("gpt_neox.final_layer_norm.{p}", "norm.{p}"),
    ("embed_out.weight", "lm_head.weight"),
]


class ViT(tc.TreeClass):
    patch_embeddings: nn.PatchEmbed
    cls_token: nn.ClassToken
    position_embeddings: nn.PositionEmbedding
    layers: tc.Stacked
    layernorm: nn.LayerNorm

    def __call__(self, images):
        x = self.cls_token(self.patch_embeddings(images))
        return self.layernorm(self.layers(self.position_embeddings(x)))


def vit(key):
    k_patch, k_cls, k_pos, k_layers = jax.random.split(key, 4)

    def block(k):
        return nn.EncoderBlock(16, 2, 32, norm_position="pre", key=k)

    return ViT(
        nn.PatchEmbed(3, 16, (4, 4), key=k_patch),  # channels first, as pixel_values
        nn.ClassToken(16, key=k_cls),
        nn.PositionEmbedding(1 + 2 * 2, 16, key=k_pos),  # the class token and 2 x 2 patches
        tc.Stacked.from_init(block, jax.random.split(k_layers, 2)),
        nn.LayerNorm(16, eps=1e-12),
    )


VIT_RULES = [
    ("embeddings.patch_embeddings.projection.{p}", "patch_embeddings.{p}"),
    (  # the file holds [1, n, features]: the inverse restores the leading axis
        "embeddings.{n:cls_token|position_embeddings}",
        "{n}.weight",
        lambda w: w[0],
        lambda w: w[None],
    ),
    ("encoder.layer.{i}.attention.attention.query.{p}", "layers[{i}].self_attn.q_proj.{p}"),
    ("encoder.layer.{i}.attention.attention.key.{p}", "layers[{i}].self_attn.k_proj.{p}"),
    ("encoder.layer.{i}.attention.attention.value.{p}", "layers[{i}].self_attn.v_proj.{p}"),
    ("encoder.layer.{i}.attention.output.dense.{p}", "layers[{i}].self_attn.o_proj.{p}"),
    ("encoder.layer.{i}.layernorm_before.{p}", "layers[{i}].input_layernorm.{p}"),
    ("encoder.layer.{i}.layernorm_after.{p}", "layers[{i}].post_attention_layernorm.{p}"),
    ("encoder.layer.{i}.intermediate.dense.{p}", "layers[{i}].mlp.up_proj.{p}"),
    ("encoder.layer.{i}.output.dense.{p}", "layers[{i}].mlp.down_proj.{p}"),
    ("layernorm.{p}", "layernorm.{p}"),
]


class Bert(tc.TreeClass):
    word_embeddings: nn.Embed
    position_embeddings: nn.PositionEmbedding
    token_type_embeddings: nn.Embed
    embeddings_norm: nn.LayerNorm
    layers: tc.Stacked
    pooler: nn.Linear

    def __call__(self, ids, attention_mask, token_type_ids):
        x = self.word_embeddings(ids) + self.token_type_embeddings(token_type_ids)
        x = self.embeddings_norm(self.position_embeddings(x))
        x = self.layers(x, mask=attention_mask.astype(bool)[..., None, None, :])  # padding
        return x, jnp.tanh(self.pooler(x[..., 0, :]))  # the states and the pooled output


def bert(key):
    k_word, k_pos, k_type, k_layers, k_pool = jax.random.split(key, 5)

    def block(k):
        return nn.EncoderBlock(16, 2, 32, key=k)  # post-norm, biases, exact GELU

    return Bert(
        nn.Embed(64, 16, key=k_word),
        nn.PositionEmbedding(16, 16, key=k_pos),
        nn.Embed(2, 16, key=k_type),
        nn.LayerNorm(16, eps=1e-12),
        tc.Stacked.from_init(block, jax.random.split(k_layers, 2)),
        nn.Linear(16, 16, key=k_pool),
    )


BERT_RULES = [
    ("embeddings.{n:word|position|token_type}_embeddings.weight", "{n}_embeddings.weight"),
    ("embeddings.LayerNorm.{p}", "embeddings_norm.{p}"),
    ("encoder.layer.{i}.attention.self.query.{p}", "layers[{i}].self_attn.q_proj.{p}"),
    ("encoder.layer.{i}.attention.self.key.{p}", "layers[{i}].self_attn.k_proj.{p}"),
    ("encoder.layer.{i}.attention.self.value.{p}", "layers[{i}].self_attn.v_proj.{p}"),
    ("encoder.layer.{i}.attention.output.dense.{p}", "layers[{i}].self_attn.o_proj.{p}"),
    (
        "encoder.layer.{i}.attention.output.LayerNorm.{p}",
        "layers[{i}].post_attention_layernorm.{p}",
    ),
    ("encoder.layer.{i}.intermediate.dense.{p}", "layers[{i}].mlp.up_proj.{p}"),
    ("encoder.layer.{i}.output.dense.{p}", "layers[{i}].mlp.down_proj.{p}"),
    ("encoder.layer.{i}.output.LayerNorm.{p}", "layers[{i}].output_layernorm.{p}"),
    ("pooler.dense.{p}", "pooler.{p}"),
]


# -- the fixtures: each family against what transformers wrote and computed --------------------

FAMILIES = {  # name: (builder, rules, the inputs, the outputs), as reference.npz names them
    "llama": (llama, LLAMA_RULES, ["input_ids"], ["logits"]),
    "qwen2": (qwen2, QWEN2_RULES, ["input_ids"], ["logits"]),
    "mistral": (mistral, MISTRAL_RULES, ["input_ids"], ["logits"]),
    "gemma": (gemma, GEMMA_RULES, ["input_ids"], ["logits"]),
    "gpt_neox": (gpt_neox, GPT_NEOX_RULES, ["input_ids"], ["logits"]),
    "vit": (vit, VIT_RULES, ["pixel_values"], ["last_hidden_state"]),
    "bert": (
        bert,
        BERT_RULES,
        ["input_ids", "attention_mask", "token_type_ids"],
        ["last_hidden_state", "pooler_output"],
    ),
}
TOL = reference_tol(atol=2e-5)
pytestmark = pytest.mark.usefixtures("highest_precision")


def _files(name):
    """The fixture's safetensors files, and what to load: the index of a sharded folder."""
    folder = FIXTURES / f"hf_{name}"
    index = folder / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / s for s in shards], index
    return [folder / "model.safetensors"], folder / "model.safetensors"


def _tensors(files):
    """Every tensor of `files` by name, and each file's header metadata."""
    tensors, metadata = {}, []
    for file in files:
        tensors.update(load_file(file))
        with safe_open(str(file), "np") as f:
            metadata.append(f.metadata())
    return tensors, metadata


@pytest.fixture(scope="module", params=list(FAMILIES))
def loaded(request):
    name = request.param
    build, rules, _, _ = FAMILIES[name]
    _, path = _files(name)
    template = jax.eval_shape(build, jax.random.key(0))  # shapes only: nothing drawn
    report = tc.load(path, template, rules=rules, dry_run=True)
    assert report.messages == () and not report.unexpected and not report.missing
    return name, tc.load(path, template, rules=rules)


def test_each_family_loads_the_transformers_file_to_the_outputs_it_recorded(loaded):
    name, model = loaded
    _, _, given, computed = FAMILIES[name]
    reference = np.load(FIXTURES / f"hf_{name}" / "reference.npz")
    with jax.default_matmul_precision("highest"):
        ours = jax.jit(jax.vmap(model))(*(reference[k] for k in given))
    ours = ours if isinstance(ours, tuple) else (ours,)
    assert len(ours) == len(computed)
    for output, key in zip(ours, computed):
        np.testing.assert_allclose(output, reference[key], **TOL, err_msg=key)


def test_each_family_exports_back_the_transformers_file_byte_for_byte(loaded, tmp_path):
    name, model = loaded
    files, path = _files(name)
    original, metadata = _tensors(files)
    assert all(m == {"format": "pt"} for m in metadata)  # where transformers reads it
    target = tmp_path / path.name
    sharded = dict(max_shard_size=10_000) if len(files) > 1 else {}
    tc.save(target, model, rules=FAMILIES[name][1], metadata={"format": "pt"}, **sharded)
    written, written_metadata = _tensors(_files_in(target))
    # every header holds exactly what transformers wrote (an export adds nothing of its own)
    assert len(written_metadata) == len(metadata) and all(
        m == {"format": "pt"} for m in written_metadata
    )
    assert sorted(written) == sorted(original)
    for key, array in original.items():
        assert (written[key].dtype, written[key].shape) == (array.dtype, array.shape), key
        assert written[key].tobytes() == array.tobytes(), key


def _files_in(path):
    if path.name.endswith(".index.json"):
        shards = set(json.loads(path.read_text())["weight_map"].values())
        return [path.parent / s for s in sorted(shards)]
    return [path]


def test_the_sharded_and_the_bfloat16_fixtures_are_what_they_claim():
    files, _ = _files("mistral")
    assert len(files) > 1  # a folder of shards and its index
    for name in ("qwen2", "gemma"):
        tensors, _ = _tensors(_files(name)[0])
        assert {str(t.dtype) for t in tensors.values()} == {"bfloat16"}, name


def test_the_fixtures_are_small():
    sizes = {
        name: sum(p.stat().st_size for p in (FIXTURES / f"hf_{name}").rglob("*") if p.is_file())
        for name in FAMILIES
    }
    assert sum(sizes.values()) < 400_000, sizes


# -- the page shows what these tests run -----------------------------------------------------


SHOWN = [
    "CausalLM",
    "causal_lm",
    "BF16",
    *("llama", "LLAMA_RULES", "qwen2", "QWEN2_RULES", "mistral", "MISTRAL_RULES"),
    *("gemma", "GEMMA_RULES", "gpt_neox", "split_heads", "GPT_NEOX_RULES"),
    *("ViT", "vit", "VIT_RULES", "Bert", "bert", "BERT_RULES"),
]


def _definitions():
    source = pathlib.Path(__file__).read_text()
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            found[node.targets[0].id] = ast.get_source_segment(source, node)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            found[node.name] = ast.get_source_segment(source, node)
    return found


@pytest.mark.parametrize("name", SHOWN)
def test_the_families_guide_shows_the_definitions_these_tests_run(name):
    blocks = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), re.MULTILINE | re.DOTALL)
    definition = _definitions()[name]
    assert any(definition in block for block in blocks), (
        f"docs/guides/families.md should show `{name}` exactly as {__name__} defines it"
    )
