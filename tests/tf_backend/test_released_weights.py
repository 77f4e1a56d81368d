"""The bert4keras model from a released checkpoint (MiniLM-L6-H384): the same hidden states as transformers, and
Google's checkpoint naming read like the original. The main suite's: the TPU environment has neither torch nor
MiniLM (the model's own tests, test_model.py, run there)."""

import os
import subprocess
import sys

import numpy as np
import pytest

# isort: off
import tpu_pretrain  # noqa: F401  (selects Keras 2; must come before tensorflow)
import tensorflow as tf

# isort: on
from released_models import minilm_folder

from tpu_pretrain.models.bert_config import BertConfig, resolve_bert_config
from tpu_pretrain.models.weight_names import huggingface_to_google, read_checkpoint_weights
from tpu_pretrain.tf_backend.model import build_pretraining_model
from tpu_pretrain.tf_backend.weights import load_init_checkpoint


def test_huggingface_init_matches_transformers():
    """Continued pretraining starts from the released model: hidden states equal HF's within 1e-4."""
    folder = minilm_folder()
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
    folder = minilm_folder()
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
