"""BERT's last block computed at the loss's rows only (``TransformerBlock.call_at_rows``: the masked positions, and
the first for NSP), and ModernBERT's last layer at its masked rows (``ModernBertLayer.call_at_rows``): the same
logits and the same gradient for every weight as the whole block gathered after, with documents apart, padding,
repeated positions, either head set (BERT), a global or a local last layer and biases or none (ModernBERT); less
arithmetic in the compiled step, by what the block's rows account for; and the explicit attention it takes with
float32 scores, for queries fewer than the keys.
"""

import importlib.util
import sys

import numpy as np
import pytest

pytest.importorskip("jax")
if importlib.util.find_spec("tensorflow") is not None:
    pytest.skip("for the environment without TensorFlow (make test-jax-stack)", allow_module_level=True)
if "keras" in sys.modules and sys.modules["keras"].backend.backend() != "jax":
    pytest.skip("Keras already runs on another backend in this process", allow_module_level=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from bert_rows import SEP, B, P, T, outputs_and_gradients  # noqa: E402

from tpu_pretrain.jax_backend.attention import attention_mask, explicit_attention  # noqa: E402
from tpu_pretrain.jax_backend.model import build_model  # noqa: E402
from tpu_pretrain.jax_backend.modernbert import build_modernbert  # noqa: E402
from tpu_pretrain.models import modernbert_config  # noqa: E402
from tpu_pretrain.models.bert_config import bert_config_for_size  # noqa: E402
from tpu_pretrain.models.modernbert_config import ModernBertConfig  # noqa: E402


@pytest.mark.parametrize("with_nsp", [True, False])
@pytest.mark.parametrize("separator", [SEP, None])
def test_the_last_block_at_the_rows_gives_what_the_whole_block_does(with_nsp, separator):
    config = bert_config_for_size("L2-H128", 300)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    model = build_model(config, T, P, with_nsp=with_nsp, dtype="float32", attention="xla")
    model.document_separator = separator
    rows_out, rows_grads = outputs_and_gradients(model, True)
    full_out, full_grads = outputs_and_gradients(model, False)
    assert len(rows_out) == (2 if with_nsp else 1) and rows_out[0].shape == (B, P, 300)
    for a, b in zip(rows_out, full_out, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-6, rtol=0)
    for variable, a, b in zip(model.trainable_variables, rows_grads, full_grads, strict=True):
        scale = float(jnp.max(jnp.abs(b)))
        assert float(jnp.max(jnp.abs(a - b))) <= 1e-5 * scale, variable.path
    # the last block's weights get a gradient at all (not only through the rows' residual)
    last_query = model.blocks[-1].query.kernel
    query = [g for v, g in zip(model.trainable_variables, rows_grads, strict=True) if v is last_query]
    assert float(jnp.max(jnp.abs(query[0]))) > 0


def tiny_modernbert(layers: int, every: int, **changes) -> ModernBertConfig:
    """Hidden 64, 4 heads, GeGLU width 96, a window of 8 (4 each side) on 32-token rows; layer ``i`` global where
    ``i % every == 0``."""
    return ModernBertConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                            num_attention_heads=4, max_position_embeddings=64, local_attention=8,
                            global_attn_every_n_layers=every, initializer_range=0.1, pad_token_id=0, bos_token_id=1,
                            eos_token_id=SEP, cls_token_id=1, sep_token_id=SEP, mask_token_id=4, **changes)


@pytest.mark.parametrize(("layers", "every", "biases"), [(3, 2, False), (3, 2, True), (3, 3, False), (1, 1, False)])
@pytest.mark.parametrize("separator", [SEP, None])
def test_modernberts_last_layer_at_the_rows_gives_what_the_whole_layer_does(layers, every, biases, separator):
    """A global last layer (3 layers, every 2nd global), with every bias ModernBERT can have, a local one (every 3rd:
    layer 2 is local, its window at the rows' own positions) and a single layer (layer 0: no attention norm)."""
    bias = dict(norm_bias=True, attention_bias=True, mlp_bias=True, classifier_bias=True) if biases else {}
    model = build_modernbert(tiny_modernbert(layers, every, **bias), T, P, dtype="float32")
    model.document_separator = separator
    rows_out, rows_grads = outputs_and_gradients(model, True)
    full_out, full_grads = outputs_and_gradients(model, False)
    assert rows_out[0].shape == (B, P, 300)
    np.testing.assert_allclose(np.asarray(rows_out[0]), np.asarray(full_out[0]), atol=2e-5, rtol=0)
    for variable, a, b in zip(model.trainable_variables, rows_grads, full_grads, strict=True):
        assert float(jnp.max(jnp.abs(a - b))) <= 1e-5 * float(jnp.max(jnp.abs(b))), variable.path
    last_wqkv = model.blocks[-1].wqkv.kernel
    assert [float(jnp.max(jnp.abs(g))) for v, g in zip(model.trainable_variables, rows_grads, strict=True)
            if v is last_wqkv][0] > 0


def step_flops(model, at_rows: bool, length: int, predictions: int) -> float:
    """The FLOPs XLA's CPU compile counts for the loss and every weight's gradient at one batch of 2."""
    model.last_block_at_rows = at_rows
    ids = jnp.ones((2, length), jnp.int32)
    positions = jnp.zeros((2, predictions), jnp.int32)
    non_trainable = [v.value for v in model.non_trainable_variables]

    def loss(weights):
        out, _ = model.stateless_call(weights, non_trainable, [ids, ids * 0, positions])
        return sum(jnp.sum(o) for o in out)

    compiled = jax.jit(jax.grad(loss)).lower([v.value for v in model.trainable_variables]).compile()
    analysis = compiled.cost_analysis()
    return (analysis[0] if isinstance(analysis, list) else analysis)["flops"]


def test_the_step_does_less_arithmetic_by_the_rows_the_loss_does_not_read():
    """The whole block minus its rows' share: the queries, output projection and feed-forward of the positions the
    loss does not read, and their attention, forward and backward (3 x); XLA also counts the elementwise work of the
    rows left out (the softmax, the GELU, the norms: saved/expected 1.0198 under jax 0.10.2, 1.0207 under 0.12.0.1),
    and what the rows path adds (the rows' gather, and a gradient for it) is a few percent of the whole."""
    config = bert_config_for_size("L2-H128", 300)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    length, predictions = 128, 20
    model = build_model(config, length, predictions, with_nsp=True, dtype="float32", attention="xla")
    saved = step_flops(model, False, length, predictions) - step_flops(model, True, length, predictions)
    h, inner, rows = config.hidden_size, config.intermediate_size, predictions + 1
    expected = 3 * 2 * (length - rows) * (4 * h * h + 4 * h * inner + 4 * length * h)
    assert 0.9 * expected <= saved <= 1.05 * expected, (saved, expected)


def test_modernberts_step_does_less_arithmetic_by_what_its_flops_formula_counts():
    """The FLOPs formula behind ModernBERT's MFU counts the last layer at the masked rows: its saving against the
    whole layer's is what XLA's compile counts, within what the formula leaves out: XLA counts the elementwise work
    too (the softmax, the GeGLU's GELU, the rotary products and the norms of the rows left out: 8.5% more here, at
    hidden 64), and the rows' gather and its gradient add a little."""
    config = tiny_modernbert(3, 2)
    length, predictions = 64, 10
    model = build_modernbert(config, length, predictions, dtype="float32", attention="xla")
    saved = step_flops(model, False, length, predictions) - step_flops(model, True, length, predictions)
    expected = (modernbert_config.training_flops_per_sequence(config, length, length)
                - modernbert_config.training_flops_per_sequence(config, length, predictions)
                - 3 * (length - predictions) * (2 * config.hidden_size**2 + 2 * config.hidden_size * config.vocab_size)
                ) * 2  # a batch of 2; the head's own share left out (it runs at the predictions either way)
    assert expected <= saved <= 1.12 * expected, (saved, expected)


def test_explicit_attention_takes_fewer_queries_than_keys_with_float32_scores():
    rng = np.random.default_rng(1)
    q = jnp.asarray(rng.normal(size=(2, 3, 2, 8)), jnp.bfloat16)
    k, v = (jnp.asarray(rng.normal(size=(2, 16, 2, 8)), jnp.bfloat16) for _ in range(2))
    attend = jnp.asarray(np.arange(16)[None] < np.array([16, 7])[:, None])
    out = explicit_attention(q, k, v, attention_mask(attend), float32_scores=True)
    exact = explicit_attention(*(t.astype(jnp.float32) for t in (q, k, v)), attention_mask(attend))
    assert out.shape == (2, 3, 2, 8) and out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(exact), atol=2e-2, rtol=0)
    for dtype in (jnp.float16, jnp.float32):  # float16 is cast first: CPUs refuse float16 dots into float32
        assert explicit_attention(*(t.astype(dtype) for t in (q, k, v)), attend, float32_scores=True).dtype == dtype


def test_the_mask_at_some_rows_is_the_whole_mask_at_those_rows():
    """``attention_mask(..., rows=)`` (the last block's queries at the loss's rows): the whole mask's rows at those
    positions, with documents apart, a window, both and neither, positions repeated."""
    rng = np.random.default_rng(2)
    attend = jnp.asarray(np.arange(16)[None] < np.array([16, 9])[:, None])
    documents = jnp.asarray(np.where(np.asarray(attend), (np.arange(16)[None] >= np.array([6, 3])[:, None]) + 1, 0))
    rows = jnp.asarray(rng.integers(0, 16, (2, 5)))
    for docs in (None, documents):
        for window in (None, 3):
            whole = np.broadcast_to(attention_mask(attend, docs, window), (2, 1, 16, 16))
            picked = np.take_along_axis(whole, np.asarray(rows)[:, None, :, None], axis=2)
            np.testing.assert_array_equal(np.broadcast_to(attention_mask(attend, docs, window, rows), picked.shape),
                                          picked)
