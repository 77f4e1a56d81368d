"""The splash attention kernel (:mod:`tpu_pretrain.jax_backend.splash`), run in Pallas's interpreter on the CPU,
against XLA's attention under the same boolean mask: global and sliding-window attention, two documents and
padding in a row, forward and gradients, float32 and bfloat16, within the tolerances the module states. Small
shapes (one 128-token block, two heads) keep the interpreter to seconds.
"""

import importlib.util
import sys
import types

import numpy as np
import pytest

pytest.importorskip("jax")
if importlib.util.find_spec("tensorflow") is not None:
    pytest.skip("for the environment without TensorFlow (make test-jax-stack)", allow_module_level=True)
if "keras" in sys.modules and sys.modules["keras"].backend.backend() != "jax":
    pytest.skip("Keras already runs on another backend in this process", allow_module_level=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from tpu_pretrain.jax_backend import splash  # noqa: E402
from tpu_pretrain.jax_backend.attention import masked_attention  # noqa: E402
from tpu_pretrain.jax_backend.documents import document_ids  # noqa: E402

L, H, D, SEP = 128, 2, 32, 3
# (forward, gradients): the tolerances splash.py's docstring states
TOLERANCES = {jnp.float32: (2e-5, 1e-4), jnp.bfloat16: (2e-2, 6e-2)}


def row():
    """One packed row: [CLS] 59 tokens [SEP], 40 tokens [SEP], then padding."""
    ids = np.full((1, L), 0, np.int32)
    ids[0, :101] = np.random.default_rng(1).integers(5, 50, 101)
    ids[0, 0], ids[0, 60], ids[0, 100] = 2, SEP, SEP
    return jnp.asarray(ids)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("window", [None, 16], ids=["global", "window"])
def test_splash_equals_xla_with_documents(dtype, window):
    ids = row()
    attend = ids != 0
    documents = document_ids(ids, attend, SEP)
    rng = np.random.default_rng(0)
    q, k, v, weight = (jnp.asarray(rng.standard_normal((1, L, H, D)), dtype) for _ in range(4))
    real = np.asarray(attend[0])  # padding's own outputs differ by design (a segment of its own) and are never read

    def loss(path):
        def f(q, k, v):
            out = masked_attention(q, k, v, attend, documents, window, path)
            return jnp.sum((out * weight).astype(jnp.float32) * attend[:, :, None, None]), out
        return jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True)(q, k, v)

    (_, ours), grads = loss("splash")
    (_, theirs), expected = loss("xla")
    forward, backward = TOLERANCES[dtype]
    np.testing.assert_allclose(np.asarray(ours, np.float32)[0, real], np.asarray(theirs, np.float32)[0, real],
                               atol=forward, rtol=0)
    for name, a, b in zip("qkv", grads, expected, strict=True):
        np.testing.assert_allclose(np.asarray(a, np.float32)[0, real], np.asarray(b, np.float32)[0, real],
                                   atol=backward, rtol=0, err_msg=f"d{name}")


def test_heads_a_kernel_refuses_are_padded_and_give_the_same_attention(monkeypatch):
    """Where this JAX's kernel refuses the head size (jax 0.6.2's, Kaggle's image: multiples of 128 only; here that
    refusal stood in for, the padding itself computed), the heads go in zero-padded to 128 and come out sliced: the
    same outputs and gradients as XLA's attention, documents apart, within float32's tolerances. (Kaggle's own
    kernel, interpreted, checked so by hand: gradients within 1e-6 for heads of 32 and 64 padded to 128.)"""
    monkeypatch.setattr(splash, "takes_head_size", lambda size: size % splash.LANES == 0)
    assert splash.kernel_head_size(D) == 128 and splash.kernel_head_size(256) == 256
    ids = row()
    attend = ids != 0
    documents = document_ids(ids, attend, SEP)
    rng = np.random.default_rng(4)
    q, k, v, weight = (jnp.asarray(rng.standard_normal((1, L, H, D)), jnp.float32) for _ in range(4))
    real = np.asarray(attend[0])

    def outputs(path):
        def f(q, k, v):
            out = masked_attention(q, k, v, attend, documents, None, path)
            return jnp.sum(out * weight * attend[:, :, None, None]), out
        return jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True)(q, k, v)

    padded = str(jax.make_jaxpr(lambda q: masked_attention(q, k, v, attend, documents, None, "splash"))(q))
    assert "pad[" in padded and f"f32[1,{H},{L},128]" in padded  # the kernel gets heads of 128
    (_, ours), grads = outputs("splash")
    (_, theirs), expected = outputs("xla")
    forward, backward = TOLERANCES[jnp.float32]
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(np.asarray(ours)[0, real], np.asarray(theirs)[0, real], atol=forward, rtol=0)
    for a, b in zip(grads, expected, strict=True):
        np.testing.assert_allclose(np.asarray(a)[0, real], np.asarray(b)[0, real], atol=backward, rtol=0)


def test_a_kernel_built_inside_one_trace_serves_the_next():
    """The kernels are cached per shape; one first built while a jit traces (the training step) must serve the next
    trace (the evaluation step, a shorter call) too: before the build was kept out of traces, the second call raised
    UnexpectedTracerError (jax 0.7.2, 0.11.2 and 0.12.0.1: the mask's arrays were the first trace's values)."""
    splash.kernel.cache_clear()
    q = jnp.asarray(np.random.default_rng(0).standard_normal((1, L, H, D)), jnp.float32)
    segments = document_ids(row(), row() != 0, SEP)
    first = jax.jit(lambda q: splash.attention(q, q, q, segments))(q)
    second = jax.jit(lambda q: 2 * splash.attention(q, q, q, segments))(q)
    np.testing.assert_array_equal(np.asarray(second), 2 * np.asarray(first))


def test_block_sizes_and_lengths():
    assert [splash.block_size(n) for n in (128, 384, 1024, 8192)] == [128, 128, 512, 512]
    with pytest.raises(ValueError, match="multiple of 128"):
        splash.block_size(100)
    assert not splash.applies(1024)  # this process's backend is a CPU: auto keeps XLA's attention


def test_auto_takes_the_kernel_on_a_tpu_from_256_tokens():
    """Compiled for a TPU, ``auto`` takes the kernel at multiples of 128 from :data:`splash.SHORTEST` (256) up; at 128
    XLA's attention, which the TPU compiler's cost model puts at fewer cycles per step there (splash.py's docstring),
    and at a length the kernel cannot take."""
    tpu = types.SimpleNamespace(devices=np.array([types.SimpleNamespace(platform="tpu")]))
    assert [n for n in (128, 200, 256, 384, 512, 1024, 8192) if splash.applies(n, tpu)] == [256, 384, 512, 1024, 8192]


def _model_outputs_and_gradients(model, inputs):
    """The model's logits and the gradient of their sum by every trainable weight (float32)."""
    weights = [v.value for v in model.trainable_variables]
    others = [v.value for v in model.non_trainable_variables]

    def total(weights):
        logits = model.stateless_call(weights, others, inputs)[0][0]
        return jnp.sum(logits * jnp.cos(logits)), logits  # every logit a different weight in the gradient

    (_, logits), grads = jax.value_and_grad(total, has_aux=True)(weights)
    return logits, dict(zip([v.path for v in model.trainable_variables], grads, strict=True))


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_the_models_on_the_kernels_path_equal_xlas(family):
    """Where the splash kernel runs, the models project into its ``[batch, heads, length, head_size]`` order and from
    it (:data:`splash.HEADS_MAJOR`: einsums, where XLA's path reshapes and transposes): the same logits and weight
    gradients as XLA's path, with documents apart (BERT: global attention with its biases; ModernBERT: rotary
    positions restarting per document, a sliding-window layer and biases everywhere)."""
    from tpu_pretrain.jax_backend.families import assign_stored_weights, stored_weights
    from tpu_pretrain.jax_backend.model import build_model
    from tpu_pretrain.jax_backend.modernbert import build_modernbert
    from tpu_pretrain.models.bert_config import bert_config_for_size
    from tpu_pretrain.models.modernbert_config import ModernBertConfig

    ids = np.concatenate([np.asarray(row()), np.asarray(row())[:, ::-1]])
    ids[1] = np.roll(ids[1], -27)  # the same tokens reversed, then the padding: documents of other lengths
    positions = np.tile(np.array([[5, 30, 70, 99]], np.int32), (2, 1))
    if family == "bert":
        config = bert_config_for_size("L2-H128", 64)
        config.num_attention_heads = H

        def build(path):
            return build_model(config, L, 4, attention=path)
    else:
        config = ModernBertConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                  num_attention_heads=H, max_position_embeddings=L, local_attention=32,
                                  global_attn_every_n_layers=2, initializer_range=0.1, pad_token_id=0,
                                  bos_token_id=2, eos_token_id=SEP, cls_token_id=2, sep_token_id=SEP,
                                  mask_token_id=4, norm_bias=True, attention_bias=True, mlp_bias=True)

        def build(path):
            return build_modernbert(config, L, 4, attention=path)
    kernels, xla = build("splash"), build("xla")
    for model in (kernels, xla):
        model.document_separator = SEP
    rng = np.random.default_rng(2)
    for variable in kernels.trainable_variables:  # biases and norms off their initial values too
        variable.assign(variable.value + rng.normal(0.0, 0.05, variable.shape).astype(np.float32))
    assign_stored_weights(xla, stored_weights(kernels), "the kernel's model")
    inputs = [jnp.asarray(ids), jnp.zeros_like(ids), jnp.asarray(positions)]
    ours, our_grads = _model_outputs_and_gradients(kernels, inputs)
    theirs, their_grads = _model_outputs_and_gradients(xla, inputs)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=1e-4, rtol=0)
    assert our_grads.keys() == their_grads.keys()
    for path, grad in our_grads.items():
        np.testing.assert_allclose(np.asarray(grad), np.asarray(their_grads[path]), atol=2e-4, rtol=1e-4, err_msg=path)
