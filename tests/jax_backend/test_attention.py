"""The JAX model's attention paths: ``jax.nn.dot_product_attention`` (the fused path) against the explicit
matmul-softmax-matmul path, in float32 and bfloat16 with padding; padded keys get no attention; the whole model
gives the same logits on either path and the same logits for a sequence however much padding follows it.

Measured on a CPU (JAX 0.10.2, these inputs: outputs of magnitude up to about 3): in float32 the two paths agree
exactly; in bfloat16 they differ by at most 0.0156, one bfloat16 step at that magnitude (the explicit path rounds its
scores to bfloat16 before the float32 softmax, the fused one accumulates them in float32), and each lies within 0.012
of the float32 answer. The tolerances below allow about twice that.
"""

import importlib.util
import sys
import types
import warnings

import numpy as np
import pytest

pytest.importorskip("jax")
if importlib.util.find_spec("tensorflow") is not None:  # the JAX backend's own tests run once, where JAX runs
    pytest.skip("for the environment without TensorFlow (make test-jax-stack)", allow_module_level=True)
if "keras" in sys.modules and sys.modules["keras"].backend.backend() != "jax":
    pytest.skip("Keras already runs on another backend in this process (run this file alone, or in .venv-jax)",
                allow_module_level=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from tpu_pretrain.errors import UserInputError  # noqa: E402
from tpu_pretrain.jax_backend.attention import (  # noqa: E402
    attention_mask,
    attention_path,
    cudnn_applies,
    explicit_attention,
    fused_attention,
)
from tpu_pretrain.jax_backend.families import assign_stored_weights, stored_weights  # noqa: E402
from tpu_pretrain.jax_backend.model import PretrainingBert, TransformerBlock, _Factory, build_model  # noqa: E402
from tpu_pretrain.models.bert_config import bert_config_for_size  # noqa: E402

B, T, N, H = 4, 16, 4, 16
LENGTHS = (16, 9, 3, 1)  # trailing padding after these many tokens
TOLERANCE = {"float32": 2e-6, "bfloat16": 3e-2}  # the largest absolute difference allowed


def qkv(dtype, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.normal(size=(B, T, N, H)), dtype) for _ in range(3))


def attend():
    return jnp.asarray(np.arange(T)[None] < np.array(LENGTHS)[:, None])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_fused_path_computes_what_the_explicit_path_does(dtype):
    q, k, v = qkv(dtype)
    fused = fused_attention(q, k, v, attend(), "xla")
    explicit = explicit_attention(q, k, v, attend())
    assert fused.dtype == explicit.dtype == jnp.dtype(dtype) and fused.shape == (B, T, N, H)
    difference = np.abs(np.asarray(fused, np.float32) - np.asarray(explicit, np.float32)).max()
    assert difference <= TOLERANCE[dtype], difference
    # the fused path in bfloat16 stays closer to the float32 answer than its own tolerance
    exact = fused_attention(*(t.astype(jnp.float32) for t in (q, k, v)), attend(), "xla")
    assert np.abs(np.asarray(fused, np.float32) - np.asarray(exact)).max() <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("path", ["xla", "explicit"])
def test_padded_keys_get_no_attention(dtype, path):
    """Whatever the keys and values at padded positions hold, nothing of them reaches any query."""
    q, k, v = qkv(dtype)
    noise_k, noise_v = (jnp.asarray(np.random.default_rng(s).normal(size=(B, T, N, H)) * 100, dtype) for s in (1, 2))
    padded = ~attend()[:, :, None, None]
    k2, v2 = jnp.where(padded, noise_k, k), jnp.where(padded, noise_v, v)
    run = (lambda *a: fused_attention(*a, "xla")) if path == "xla" else explicit_attention
    np.testing.assert_array_equal(np.asarray(run(q, k, v, attend()), np.float32),
                                  np.asarray(run(q, k2, v2, attend()), np.float32))
    # and with the padded values zeroed, a one-token sequence's outputs are its one value
    one = run(q, k, v, attend())[3]
    np.testing.assert_allclose(np.asarray(one, np.float32), np.broadcast_to(np.asarray(v[3, :1], np.float32),
                                                                            (T, N, H)), atol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_the_fused_path_compiles_and_differentiates_in_each_precision(dtype):
    """float16 included: XLA's CPU dots refuse float16 inputs with float32 results, which the function asks for."""
    q, k, v = qkv(dtype)
    loss = jax.jit(jax.grad(lambda q: fused_attention(q, k, v, attend(), "auto").astype(jnp.float32).sum()))
    assert loss(q).dtype == jnp.dtype(dtype) and np.isfinite(np.asarray(loss(q), np.float32)).all()


def test_a_row_of_padding_alone_gives_finite_outputs():
    q, k, v = qkv("float32")
    nothing = jnp.zeros((B, T), bool)
    for out in (fused_attention(q, k, v, nothing, "xla"), explicit_attention(q, k, v, nothing)):
        assert np.isfinite(np.asarray(out)).all()


@pytest.fixture(scope="module")
def models():
    config = bert_config_for_size("L2-H128", 300)
    explicit = build_model(config, T, 3, attention="explicit")
    fused = build_model(config, T, 3, attention="xla")
    assign_stored_weights(fused, stored_weights(explicit), "the explicit model")
    return config, explicit, fused


def batch(length_of_first=T):
    rng = np.random.default_rng(3)
    ids = rng.integers(5, 300, (B, T)).astype(np.int32)
    ids[np.arange(T)[None] >= np.array(LENGTHS)[:, None]] = 0
    ids[0, length_of_first:] = 0
    segments = (np.arange(T)[None] >= 4).astype(np.int32).repeat(B, 0) * (ids != 0)
    positions = np.tile(np.array([0, 1, 2], np.int32), (B, 1))
    return ids, segments, positions


def test_the_model_gives_the_same_logits_on_either_path(models):
    _, explicit, fused = models
    ids, segments, positions = batch()
    assert explicit.attention == "explicit" and fused.attention == "xla"
    for a, b in zip(explicit([ids, segments, positions]), fused([ids, segments, positions]), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=0)


def test_padding_after_a_sequence_changes_nothing_before_it(models):
    """The first 9 tokens alone (a model of length 9, the same weights) give the same hidden states as the same
    tokens followed by 7 [PAD]s: padded positions give and take nothing."""
    config, _, fused = models
    ids, segments, _ = batch(9)
    short = build_model(config, 9, 3, attention="xla")
    assign_stored_weights(short, stored_weights(fused), "the fused model")
    long_hidden = np.asarray(fused.encode(ids[:1], segments[:1]))[0, :9]
    short_hidden = np.asarray(short.encode(ids[:1, :9], segments[:1, :9]))[0]
    np.testing.assert_allclose(long_hidden, short_hidden, atol=2e-5, rtol=0)


def test_attention_dropout_in_training_takes_the_explicit_path():
    config = bert_config_for_size("L2-H128", 300)
    config.attention_probs_dropout_prob = 0.1
    block = TransformerBlock(config, _Factory(config, None), "auto")
    assert block.explicit(training=True) and not block.explicit(training=False)
    config.attention_probs_dropout_prob = 0.0
    block = TransformerBlock(config, _Factory(config, None), "auto")
    assert not block.explicit(training=True)
    assert TransformerBlock(config, _Factory(config, None), "explicit").explicit(training=False)


def test_the_path_is_chosen_by_setting_or_environment(monkeypatch):
    monkeypatch.delenv("TPU_PRETRAIN_ATTENTION", raising=False)
    assert attention_path() == "auto" and attention_path("XLA") == "xla"
    monkeypatch.setenv("TPU_PRETRAIN_ATTENTION", "explicit")
    assert attention_path() == "explicit"
    assert PretrainingBert(bert_config_for_size("L2-H128", 300)).attention == "explicit"
    monkeypatch.setenv("TPU_PRETRAIN_ATTENTION", "flash")
    with pytest.raises(UserInputError, match="flash"):
        attention_path()


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="on a GPU cuDNN may take these inputs")
def test_auto_uses_xla_off_a_gpu_and_cudnn_asked_for_there_fails_loudly():
    q, k, v = qkv("bfloat16")
    np.testing.assert_array_equal(np.asarray(fused_attention(q, k, v, attend(), "auto"), np.float32),
                                  np.asarray(fused_attention(q, k, v, attend(), "xla"), np.float32))
    with pytest.raises(Exception):  # noqa: B017  (cuDNN's own error: no cuDNN, or not a CUDA device)
        fused_attention(q, k, v, attend(), "cudnn")


def described_gpu(capability: str, kind: str):
    """A mesh of one GPU as the compiler is told of it (its platform, compute capability and name): a T4 or an A100
    cannot be here, so the attention path is chosen for one while the arrays are computed on the CPU."""
    device = types.SimpleNamespace(platform="gpu", compute_capability=capability, device_kind=kind)
    return types.SimpleNamespace(devices=np.array([device]))


def test_cudnn_is_taken_on_an_ampere_or_newer_gpu_only():
    """cuDNN's fused attention refuses 16-bit graphs below compute capability 8.0 only on the card, after tracing
    (JAX does not check): on the free T4 (7.5, float16) ``auto`` must compile the explicit path (scores in the
    inputs' dtype: fewer bytes than XLA's function there) and ``cudnn`` must say why not."""
    t4, a100 = described_gpu("7.5", "Tesla T4"), described_gpu("8.0", "NVIDIA A100-SXM4-40GB")
    assert not cudnn_applies(jnp.float16, H, t4) and cudnn_applies(jnp.float16, H, a100)
    assert not cudnn_applies(jnp.float16, H)  # this process's own device: the CPU
    q, k, v = qkv("float16")  # what a T4 trains in; the described mesh says what it is compiled for
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        on_t4 = fused_attention(q, k, v, attend(), "auto", mesh=t4)
    assert not said  # cuDNN not tried at all
    np.testing.assert_array_equal(np.asarray(on_t4, np.float32), np.asarray(explicit_attention(q, k, v, attend()),
                                                                            np.float32))
    documents = jnp.asarray(np.where(np.asarray(attend()), 1 + (np.arange(T) >= 6), 0), jnp.int32)
    np.testing.assert_array_equal(  # documents apart: the same block-diagonal mask the other paths take
        np.asarray(fused_attention(q, k, v, attend(), "auto", documents, mesh=t4), np.float32),
        np.asarray(explicit_attention(q, k, v, attention_mask(attend(), documents)), np.float32))
    with pytest.warns(UserWarning, match="cuDNN fused attention refused"):  # tried on an A100 (no cuDNN here)
        fused_attention(q, k, v, attend(), "auto", mesh=a100)
    with pytest.raises(UserInputError, match=r"compute capability 8.0 or newer.*Tesla T4 has 7.5"):
        fused_attention(q, k, v, attend(), "cudnn", mesh=t4)


@pytest.mark.parametrize("path", ["xla", "explicit"])
def test_the_keys_bias_is_left_out_for_softmax_does_not_see_it(models, path):
    """The key's bias adds ``q . bias`` to every score of a query's row, which softmax cancels: each block leaves it
    out (and with it a reduction per block in the backward pass), giving what attention with it gives (a large bias
    here, padding masked), and the gradient reaching it is exactly zero, where computing it gave rounding noise that
    AdamW turned into steps of the learning rate's size."""
    config, explicit, _ = models
    model = build_model(config, T, 3, attention=path)
    assign_stored_weights(model, stored_weights(explicit), "the explicit model")
    block = model.blocks[0]
    block.key.bias.assign(np.random.default_rng(5).normal(0.0, 3.0, block.key.bias.shape).astype(np.float32))
    x = jnp.asarray(np.random.default_rng(6).normal(0.0, 1.0, (B, T, config.hidden_size)).astype(np.float32))
    attend = jnp.asarray(np.arange(T)[None] < np.array(LENGTHS)[:, None])
    context, _ = block.context(x, attend)

    def heads(layer):  # with its bias, the key's included
        return (x @ layer.kernel.value + layer.bias.value).reshape(B, T, config.num_attention_heads, -1)

    want = explicit_attention(heads(block.query), heads(block.key), heads(block.value), attend).reshape(B, T, -1)
    np.testing.assert_allclose(np.asarray(context), np.asarray(want), atol=2e-5, rtol=0)

    ids, segments, positions = batch()
    weights = [v.value for v in model.trainable_variables]
    others = [v.value for v in model.non_trainable_variables]

    def loss(w):
        outputs = model.stateless_call(w, others, [ids, segments, positions])[0]
        return sum(jnp.sum(o) for o in jax.tree_util.tree_leaves(outputs))

    grads = dict(zip([v.path for v in model.trainable_variables], jax.grad(loss)(weights), strict=True))
    key_biases = [path for path in grads if "/key/" in path and path.endswith("bias")]
    assert len(key_biases) == config.num_hidden_layers
    assert all(not np.any(np.asarray(grads[path])) for path in key_biases)
    assert all(np.any(np.asarray(grads[path])) for path in grads if "/query/" in path)  # the others flow
