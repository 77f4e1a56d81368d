"""ModernBERT on the JAX backend against transformers' ``ModernBertForMaskedLM``: the same MLM logits from the same
weights on real sentences (a padded row, sequences longer than the local window, global and local layers), the
transformers folder both ways, the config both ways, clear errors, and finite gradients of every weight.

Tiny shapes: 3 layers (0 and 2 global, 1 local: every 2nd), hidden 64, 4 heads, GeGLU width 96, a window of 16
tokens (8 each side) on 48-token rows, a word-level vocab trained here on WikiText-2 lines. Every transformers
weight is perturbed from its initial value (norms away from one, biases away from zero) so a misplaced one shows.
"""

import importlib.util
import json
import sys
from dataclasses import replace
from unittest import mock

import numpy as np
import pytest

pytest.importorskip("jax")
if importlib.util.find_spec("tensorflow") is not None:  # the JAX backend's own tests run once, where JAX runs
    pytest.skip("for the environment without TensorFlow (make test-jax-stack)", allow_module_level=True)
if "keras" in sys.modules and sys.modules["keras"].backend.backend() != "jax":
    pytest.skip("Keras already runs on another backend in this process (run this file alone, or in .venv-jax)",
                allow_module_level=True)
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from corpora import WIKITEXT  # noqa: E402

from tpu_pretrain.errors import UserInputError  # noqa: E402
from tpu_pretrain.export.hf_modernbert import read_modernbert_folder, write_modernbert_folder  # noqa: E402
from tpu_pretrain.jax_backend.families import assign_stored_weights, stored_weights  # noqa: E402
from tpu_pretrain.jax_backend.modernbert import build_modernbert, hf_variables  # noqa: E402
from tpu_pretrain.models.modernbert_config import ModernBertConfig, modernbert_config_for_size  # noqa: E402

T, P = 48, 10  # tokens per row, predictions per row
LENGTHS = (48, 30, 48)  # row 1 ends in 18 [PAD]s
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TOLERANCE = 1e-4
SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
             max_position_embeddings=128, local_attention=16, global_attn_every_n_layers=2, local_rope_theta=100.0,
             initializer_range=0.1, pad_token_id=0, bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3,
             mask_token_id=4)
VARIANTS = {"published": {},  # ModernBERT's own settings: no biases but the decoder's, tied decoder
            "biases-untied": dict(norm_bias=True, attention_bias=True, mlp_bias=True, classifier_bias=True,
                                  tie_word_embeddings=False)}


@pytest.fixture(scope="module")
def text():
    """A word-level tokenizer trained on WikiText-2 lines, and a batch of its sentences with [MASK]ed slots."""
    if not WIKITEXT.is_file():
        pytest.skip(f"{WIKITEXT} is absent")
    lines = [line.strip() for line in WIKITEXT.read_text(encoding="utf-8").splitlines()[:400]
             if len(line.split()) > 20 and not line.strip().startswith("=")]
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(lines, tokenizers.trainers.WordLevelTrainer(vocab_size=500,
                                                                               special_tokens=SPECIALS))
    ids = np.zeros((len(LENGTHS), T), np.int32)
    positions = np.zeros((len(LENGTHS), P), np.int32)
    rng = np.random.default_rng(0)
    for row, length in enumerate(LENGTHS):
        words = tokenizer.encode(lines[row + 1]).ids[: length - 2]
        assert len(words) == length - 2, "the sentences are long enough"
        ids[row, :length] = [2, *words, 3]
        positions[row] = np.sort(rng.choice(np.arange(1, length - 1), P, replace=False))
        ids[row, positions[row]] = 4  # [MASK]
    return tokenizer, ids, positions


def config_for(text, variant="published", **changes):
    return ModernBertConfig(vocab_size=text[0].get_vocab_size(), **SHAPE, **VARIANTS[variant], **changes)


def torch_model(config, seed=0):
    """transformers' model from the config, every weight moved off its initial value (seeded)."""
    torch.manual_seed(seed)
    hf = transformers.ModernBertForMaskedLM(
        transformers.ModernBertConfig(**config.to_hf_dict(), attn_implementation="eager")).eval()
    with torch.no_grad():
        for _, parameter in hf.named_parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    return hf


def torch_logits(hf, ids, positions):
    with torch.no_grad():
        logits = hf(input_ids=torch.tensor(ids, dtype=torch.long),
                    attention_mask=torch.tensor(ids != 0, dtype=torch.long)).logits.numpy()
    return np.take_along_axis(logits, positions[:, :, None], axis=1)


def jax_logits(model, ids, positions):
    return np.asarray(model([ids, np.zeros_like(ids), positions], training=False)[0])


def state_dict(hf):
    return {name: value.numpy() for name, value in hf.state_dict().items()}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_same_logits_as_transformers(text, variant):
    _, ids, positions = text
    config = config_for(text, variant)
    hf = torch_model(config)
    model = build_modernbert(config, T, P)
    loaded, missing = assign_stored_weights(model, state_dict(hf), "transformers' model")
    assert not missing and len(loaded) == len(hf_variables(model))
    expected, got = torch_logits(hf, ids, positions), jax_logits(model, ids, positions)
    assert got.dtype == np.float32 and got.shape == (len(LENGTHS), P, config.vocab_size)
    difference = np.abs(got - expected).max()
    print(f"{variant}: max abs logit difference {difference:.2e} (logits up to {np.abs(expected).max():.2f})")
    assert difference <= TOLERANCE, difference
    # the window matters here: the same weights with a window wider than the rows give other logits
    wide = build_modernbert(replace(config, local_attention=2 * T), T, P)
    assign_stored_weights(wide, state_dict(hf), "transformers' model")
    assert np.abs(jax_logits(wide, ids, positions) - expected).max() > 100 * TOLERANCE


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_gpus_column_blocks_give_the_same_logits_and_gradients(text, variant):
    """On a GPU ``Wqkv`` is applied as three products of its column blocks (``modernbert.column_blocks``), elsewhere
    as one product and its slices: traced both ways here (the backend reported as ``gpu``, float32 so no cuDNN), the
    same logits as transformers' and the same gradients for every weight."""
    _, ids, positions = text
    config = config_for(text, variant)
    hf = torch_model(config)
    model = build_modernbert(config, T, P)
    assign_stored_weights(model, state_dict(hf), "transformers' model")
    weights = [v.value for v in model.trainable_variables]
    others = [v.value for v in model.non_trainable_variables]
    scale = jnp.cos(jnp.arange(config.vocab_size, dtype=jnp.float32))

    def loss(w):
        logits = model.stateless_call(w, others, [ids, np.zeros_like(ids), positions], training=False)[0][0]
        return jnp.sum(logits * scale), logits

    (value, logits), grads = jax.value_and_grad(loss, has_aux=True)(weights)
    with mock.patch("jax.default_backend", lambda: "gpu"):
        (gpu_value, gpu_logits), gpu_grads = jax.value_and_grad(loss, has_aux=True)(weights)
    assert np.abs(np.asarray(gpu_logits) - torch_logits(hf, ids, positions)).max() <= TOLERANCE
    np.testing.assert_allclose(gpu_logits, logits, atol=1e-5)
    np.testing.assert_allclose(gpu_value, value, rtol=1e-5)
    for variable, g, want in zip(model.trainable_variables, gpu_grads, grads, strict=True):
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-5 * float(jnp.max(jnp.abs(want))),
                                   err_msg=variable.path)


def test_hf_names_are_transformers_state_dict_names(text):
    for variant in VARIANTS:
        config = config_for(text, variant)
        expected = set(state_dict(torch_model(config)))
        names = set(hf_variables(build_modernbert(config, T, P)))
        tied = {"decoder.weight"} if config.tie_word_embeddings else set()
        assert names == expected - tied, (variant, sorted(names ^ (expected - tied)))


def test_an_export_loads_in_transformers_and_a_transformers_folder_loads_here(text, tmp_path):
    tokenizer, ids, positions = text
    config = config_for(text)
    model = build_modernbert(config, T, P)
    rng = np.random.default_rng(1)
    for variable in hf_variables(model).values():  # every weight off its initial value
        variable.assign(np.asarray(variable.value) + rng.normal(0, 0.1, variable.shape).astype(np.float32))
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    folder = write_modernbert_folder(model, config, tmp_path / "export", tokenizer_files=[tmp_path / "tokenizer.json"])
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    hf, info = transformers.AutoModelForMaskedLM.from_pretrained(folder, output_loading_info=True,
                                                                 attn_implementation="eager")
    assert type(hf).__name__ == "ModernBertForMaskedLM"
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert transformers.AutoConfig.from_pretrained(folder).layer_types == config.layer_types
    exported = np.abs(torch_logits(hf.eval(), ids, positions) - jax_logits(model, ids, positions)).max()
    # back: transformers' own save_pretrained, read here into a fresh model
    hf.save_pretrained(tmp_path / "saved")
    read_config, weights = read_modernbert_folder(tmp_path / "saved")
    assert read_config == config
    fresh = build_modernbert(read_config, T, P)
    assert not assign_stored_weights(fresh, weights, "saved")[1]
    reread = np.abs(jax_logits(fresh, ids, positions) - jax_logits(model, ids, positions)).max()
    print(f"export -> transformers: {exported:.2e}; save_pretrained -> JAX: {reread:.2e}")
    assert exported <= TOLERANCE and reread <= TOLERANCE, (exported, reread)
    np.testing.assert_array_equal(stored_weights(fresh)["model.layers.1.attn.Wqkv.weight"],
                                  stored_weights(model)["model.layers.1.attn.Wqkv.weight"])


def test_the_errors_name_what_is_wrong(text, tmp_path):
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 30522}))
    with pytest.raises(UserInputError, match=r"config\.json.*'bert'"):
        read_modernbert_folder(tmp_path / "bert")
    with pytest.raises(UserInputError, match="not a folder"):
        read_modernbert_folder(tmp_path / "nothing")
    config = config_for(text)
    model = build_modernbert(config, T, P)
    weights = stored_weights(model)
    weights["model.layers.1.attn.Wqkv.weight"] = np.zeros((96, 64), np.float32)
    with pytest.raises(UserInputError, match=r"model\.layers\.1\.attn\.Wqkv\.weight has shape \(96, 64\) but the "
                                             r"model needs \(192, 64\)"):
        assign_stored_weights(model, weights, "a checkpoint")
    weights = {**stored_weights(model), "decoder.weight": np.ones((config.vocab_size, 64), np.float32)}
    with pytest.raises(UserInputError, match="decoder.weight differs"):
        assign_stored_weights(model, weights, "a checkpoint")
    with pytest.raises(UserInputError, match="no ModernBERT weights"):
        assign_stored_weights(model, {"bert.embeddings.word_embeddings.weight": np.zeros(3)}, "a BERT")
    with pytest.raises(UserInputError, match="num_attention_heads"):
        replace(config, num_attention_heads=5)
    with pytest.raises(UserInputError, match="pad_token_id"):
        replace(config, pad_token_id=config.vocab_size)
    with pytest.raises(UserInputError, match="max_position_embeddings 128"):
        build_modernbert(config, 256, P)


def test_the_config_round_trips_through_transformers():
    for config in (modernbert_config_for_size("base"), modernbert_config_for_size("large"),
                   modernbert_config_for_size("L2-H128", vocab_size=500, pad_token_id=0, bos_token_id=2,
                                              eos_token_id=3, cls_token_id=2, sep_token_id=3, mask_token_id=4,
                                              norm_bias=True, global_attn_every_n_layers=1)):
        theirs = transformers.ModernBertConfig(**config.to_hf_dict())
        assert theirs.layer_types == config.layer_types and theirs.sliding_window == config.local_attention // 2
        assert ModernBertConfig.from_hf_dict(theirs.to_dict()) == config
    base, large = modernbert_config_for_size("base"), modernbert_config_for_size("LARGE")
    assert (base.num_hidden_layers, base.hidden_size, base.intermediate_size, base.num_attention_heads,
            base.vocab_size, base.max_position_embeddings) == (22, 768, 1152, 12, 50368, 8192)
    assert (large.num_hidden_layers, large.hidden_size, large.intermediate_size, large.num_attention_heads,
            large.vocab_size, large.max_position_embeddings) == (28, 1024, 2624, 16, 50368, 8192)
    assert base.layer_types[:4] == ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    # the published checkpoints' spelling (transformers 4.x): global_attn_every_n_layers and the two thetas
    hub = {"model_type": "modernbert", "global_attn_every_n_layers": 3, "global_rope_theta": 160000.0,
           "local_rope_theta": 10000.0, "local_attention": 128, "pad_token_id": 50283}
    assert ModernBertConfig.from_hf_dict(hub) == replace(base, mask_token_id=None, bos_token_id=None,
                                                         eos_token_id=None, cls_token_id=None, sep_token_id=None)
    with pytest.raises(UserInputError, match="layer_types"):
        ModernBertConfig.from_hf_dict({"model_type": "modernbert", "num_hidden_layers": 3,
                                       "layer_types": ["full_attention", "full_attention", "sliding_attention"]})
    with pytest.raises(UserInputError, match="model_size 'L3-H100'"):
        modernbert_config_for_size("L3-H100")


def test_every_weight_gets_a_finite_gradient(text):
    """One jitted value_and_grad of the masked-LM loss in training mode (all dropouts on: the explicit path)."""
    _, ids, positions = text
    config = config_for(text, embedding_dropout=0.1, attention_dropout=0.1, mlp_dropout=0.1)
    model = build_modernbert(config, T, P)
    labels = np.random.default_rng(2).integers(len(SPECIALS), config.vocab_size, positions.shape)
    trainable = [v.value for v in model.trainable_variables]
    keras_state = [v.value for v in model.non_trainable_variables]

    def loss(params):
        (logits,), _ = model.stateless_call(params, keras_state, [ids, np.zeros_like(ids), positions], training=True)
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(log_probs, jnp.asarray(labels)[:, :, None], axis=-1))

    value, grads = jax.jit(jax.value_and_grad(loss))(trainable)
    assert np.isfinite(float(value))
    names = [v.path for v in model.trainable_variables]
    assert len(names) == len(hf_variables(model))
    for name, grad in zip(names, grads, strict=True):
        assert np.isfinite(np.asarray(grad)).all() and np.abs(np.asarray(grad)).max() > 0, name


def test_bfloat16_gives_the_float32_logits_within_its_precision(text):
    """The mixed bfloat16 policy (a TPU's): float32 logits within 0.05 of float32's (bfloat16 keeps 8 bits)."""
    _, ids, positions = text
    config = config_for(text)
    model = build_modernbert(config, T, P)
    mixed = build_modernbert(config, T, P, dtype="mixed_bfloat16")
    assign_stored_weights(mixed, stored_weights(model), "the float32 model")
    got, expected = jax_logits(mixed, ids, positions), jax_logits(model, ids, positions)
    difference = np.abs(got - expected).max()
    print(f"bfloat16 against float32: {difference:.3f} (logits up to {np.abs(expected).max():.2f})")
    assert got.dtype == np.float32 and difference <= 0.05, difference


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("heads_major", [False, True])
def test_the_rotation_is_exact_in_float32_and_within_bfloat16s_precision(heads_major, per_token):
    """``apply_rotary`` against the halves' rotation in float64, positions to 8,192 (ModernBERT's longest): float32
    to 1e-5; in bfloat16 (computed in bfloat16, as transformers does) within 0.4% rms of the exact rotation of its
    rounded input (measured 0.27%; computed in float32 and rounded once it is 0.17%)."""
    from tpu_pretrain.jax_backend.modernbert import apply_rotary

    batch, length, heads, size = 2, 8192, 2, 64
    positions = np.arange(length)[None].repeat(batch, 0)
    positions[1] = np.arange(length) % 1000  # documents of 1,000 tokens
    angles = positions[..., None] / 160000.0 ** (np.arange(0, size, 2) / size)
    angles = np.concatenate([angles, angles], axis=-1)  # [batch, length, size]
    cos, sin = (np.cos(angles), np.sin(angles)) if per_token else (np.cos(angles[0]), np.sin(angles[0]))
    x = np.random.default_rng(5).normal(0.0, 2.0, (batch, heads, length, size) if heads_major
                                        else (batch, length, heads, size))
    half = size // 2
    table = (lambda t: t[:, None] if heads_major else t[:, :, None]) if per_token else (
        lambda t: t[None, None] if heads_major else t[None, :, None])
    for dtype, bound in ((jnp.float32, 1e-5), (jnp.bfloat16, 4e-3)):
        rounded = np.asarray(jnp.asarray(x, dtype).astype(jnp.float64))
        exact = rounded * table(cos) + np.concatenate([-rounded[..., half:], rounded[..., :half]], -1) * table(sin)
        got = apply_rotary(jnp.asarray(x, dtype), jnp.asarray(cos, jnp.float32), jnp.asarray(sin, jnp.float32),
                           heads_major=heads_major)
        assert got.dtype == dtype
        error = np.sqrt(np.mean((np.asarray(got, np.float64) - exact) ** 2) / np.mean(exact ** 2))
        assert error <= bound, (dtype, error)
