"""The bert4keras pretraining model: fresh initial draws, masked-position MLM head, named sizes and config files.
Released weights: test_released_weights.py."""

import numpy as np
import pytest

# isort: off
import tpu_pretrain  # noqa: F401  (selects Keras 2; must come before tensorflow)
import tensorflow as tf

# isort: on
from tpu_pretrain.errors import UserInputError
from tpu_pretrain.models.bert_config import BertConfig, bert_config_for_size, resolve_bert_config
from tpu_pretrain.tf_backend.model import build_pretraining_model


@pytest.fixture(scope="module")
def tiny():
    tf.keras.utils.set_random_seed(0)
    return build_pretraining_model(bert_config_for_size("L2-H128", 300), max_seq_length=16,
                                   max_predictions_per_seq=4)


def test_every_weight_matrix_gets_its_own_draw(tiny):
    """The shared-initializer trap: bert4keras's Q, K, V, O (and FFN) kernels must not be equal."""
    kernels = {v.name: v.numpy() for v in tiny.model.weights if len(v.shape) == 2}
    assert len(kernels) >= 2 * 6 + 4
    names = sorted(kernels)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if kernels[a].shape == kernels[b].shape:
                assert not np.allclose(kernels[a], kernels[b]), f"{a} and {b} start identical"
    attention = [kernels[n] for n in names if "Transformer-0-MultiHeadSelfAttention/" in n]
    assert len(attention) == 4
    for k in attention:  # BERT's truncated normal, stddev 0.02
        assert 0.015 < k.std() < 0.02 and np.abs(k).max() <= 0.04 + 1e-6


def test_mlm_head_is_tied_and_computed_at_masked_positions(tiny):
    assert tiny.model.output_shape[0] == (None, 4, 300)
    # tied: the only [vocab, hidden] matrix is the token embedding
    assert [v.name for v in tiny.model.weights if tuple(v.shape) == (300, 128)] == ["Embedding-Token/embeddings:0"]
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 300, (2, 16)).astype("int32")
    ids[1, 10:] = 0
    segments = np.zeros((2, 16), "int32")
    positions = np.array([[1, 3, 5, 0], [2, 4, 0, 0]], "int32")
    mlm_logits, nsp_logits = tiny.model([ids, segments, positions])
    sequence = tiny.encoder([ids, segments]).numpy()
    layers = tiny.bert.layers
    h = layers["MLM-Norm"](layers["MLM-Dense"](np.take_along_axis(sequence, positions[..., None], 1)))
    expected = layers["MLM-Bias"](tf.matmul(h, layers["Embedding-Token"].embeddings, transpose_b=True))
    np.testing.assert_allclose(mlm_logits.numpy(), expected.numpy(), atol=1e-5)
    assert nsp_logits.shape == (2, 2)


def test_named_sizes_and_config_files(tmp_path):
    base = bert_config_for_size("base", 30522)
    assert (base.num_hidden_layers, base.hidden_size, base.num_attention_heads, base.intermediate_size) == (
        12, 768, 12, 3072)
    assert bert_config_for_size("L24-H1024", 100).num_attention_heads == 16
    with pytest.raises(UserInputError, match="L4-H256"):
        bert_config_for_size("L5-H100", 100)
    path = tmp_path / "bert_config.json"
    bert_config_for_size("L4-H256", 500).to_json_file(path)
    assert BertConfig.from_json_file(path) == bert_config_for_size("L4-H256", 500)
    assert resolve_bert_config(bert_config_file=str(path), vocab_size=500).hidden_size == 256
    with pytest.raises(UserInputError, match="vocab"):
        resolve_bert_config(bert_config_file=str(path), vocab_size=501)


@pytest.mark.parametrize("hidden_act, approximate", [("gelu", False), ("gelu_new", True)])
def test_the_feed_forward_and_head_compute_the_gelu_named(hidden_act, approximate):
    """``gelu`` is the exact GELU and ``gelu_new`` the tanh one in both backends (bert4keras calls it gelu_tanh)."""
    built = build_pretraining_model(bert_config_for_size("L2-H128", 300, hidden_act=hidden_act), max_seq_length=16,
                                    max_predictions_per_seq=4, with_nsp=False)
    x = tf.constant(np.linspace(-6.0, 6.0, 1201), tf.float32)
    want = tf.nn.gelu(x, approximate=approximate).numpy()
    for f in (*built.bert.layers["Transformer-0-FeedForward"].activation, built.bert.layers["MLM-Dense"].activation):
        np.testing.assert_allclose(f(x).numpy(), want, atol=2e-6)
    other = tf.nn.gelu(x, approximate=not approximate).numpy()
    assert np.abs(want - other).max() > 1e-4  # the two differ where the test can see it
