"""Documents kept apart in packed rows (``document_masks``): document ids and positions from the [SEP]s, and a packed
row giving each document the hidden states it gets alone, for BERT and ModernBERT (global and sliding-window layers,
documents longer than the window), on the XLA and explicit paths; the setting's ``auto`` and its continuity rule.
"""

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest
from fault_injection import ENV, sample_data

pytest.importorskip("jax")
if importlib.util.find_spec("tensorflow") is not None:
    pytest.skip("for the environment without TensorFlow (make test-jax-stack)", allow_module_level=True)
if "keras" in sys.modules and sys.modules["keras"].backend.backend() != "jax":
    pytest.skip("Keras already runs on another backend in this process", allow_module_level=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from tpu_pretrain.config import Config  # noqa: E402
from tpu_pretrain.core.document_masks import document_masks_wanted  # noqa: E402
from tpu_pretrain.jax_backend.documents import document_ids, document_positions  # noqa: E402
from tpu_pretrain.jax_backend.model import build_model  # noqa: E402
from tpu_pretrain.jax_backend.modernbert import build_modernbert  # noqa: E402
from tpu_pretrain.models.bert_config import BertConfig  # noqa: E402
from tpu_pretrain.models.modernbert_config import ModernBertConfig  # noqa: E402

CLS, SEP, T = 2, 3, 48
A, B = 25, 14  # document lengths (with their [SEP]); the second is longer than ModernBERT's 8-token half window


def rows():
    """A packed row ``[CLS] a [SEP] b [SEP] [PAD]...`` and each document alone at the start of a row."""
    rng = np.random.default_rng(0)
    a, b = rng.integers(5, 60, A - 2), rng.integers(5, 60, B - 1)
    packed = np.zeros((1, T), np.int32)
    packed[0, :A + B] = np.concatenate([[CLS], a, [SEP], b, [SEP]])
    alone = np.zeros((2, T), np.int32)
    alone[0, :A] = packed[0, :A]
    alone[1, :B] = packed[0, A:A + B]
    return packed, alone


def test_document_ids_and_positions():
    packed, _ = rows()
    docs = np.asarray(document_ids(packed, packed != 0, SEP))[0]
    assert (docs[:A] == 1).all() and (docs[A:A + B] == 2).all() and (docs[A + B:] == 0).all()
    positions = np.asarray(document_positions(jnp.asarray(docs[None])))[0]
    np.testing.assert_array_equal(positions[:A + B], np.r_[np.arange(A), np.arange(B)])
    np.testing.assert_array_equal(np.asarray(document_ids(packed, packed != 0, None))[0], (packed[0] != 0))


def bert():
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=48, max_position_embeddings=64)
    return build_model(config, T, 4, with_nsp=False)


def modernbert():
    config = ModernBertConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                              num_attention_heads=2, max_position_embeddings=64, local_attention=16,
                              global_attn_every_n_layers=2, local_rope_theta=100.0, pad_token_id=0, bos_token_id=CLS,
                              eos_token_id=SEP, cls_token_id=CLS, sep_token_id=SEP, mask_token_id=4)
    return build_modernbert(config, T, 4)


@pytest.mark.parametrize(("build", "path"), [(bert, "xla"), (modernbert, "xla"), (modernbert, "explicit")],
                         ids=["bert-xla", "modernbert-xla", "modernbert-explicit"])
def test_each_document_gets_what_it_gets_alone(build, path):
    model = build()
    for block in model.blocks:
        block.attention = path
    packed, alone = rows()

    def encode(ids):  # traced once per call (the weights as constants): faster than Keras's eager layers
        return np.asarray(jax.jit(lambda x: model.encode(x, jnp.zeros_like(x)))(ids))

    together = encode(packed)[0]
    model.document_separator = SEP
    apart, single = encode(packed)[0], encode(alone)
    np.testing.assert_allclose(apart[:A], single[0, :A], atol=2e-5)
    np.testing.assert_allclose(apart[A:A + B], single[1, :B], atol=2e-5)
    assert np.abs(together[A:A + B] - single[1, :B]).max() > 1e-3  # without the masks the documents mix


def test_setting_auto_and_continuity():
    modern = Config.from_kwargs(model_family="modernbert", no_nsp=True)
    assert document_masks_wanted(modern, None)
    assert document_masks_wanted(modern, {"train": {"document_masks": "on"}})
    assert not document_masks_wanted(modern, {"train": {"backend": "jax"}})  # a run started before the setting
    classic = Config.from_kwargs(model_family="bert", recipe="classic")
    assert not document_masks_wanted(classic, None)  # sentence pairs: the [SEP] joins the halves
    assert document_masks_wanted(Config.from_kwargs(recipe="modern"), None)
    assert not document_masks_wanted(Config.from_kwargs(model_family="modernbert", no_nsp=True,
                                                        document_masks="off"), None)


def test_masks_on_sentence_pairs_are_said_and_a_resume_that_switches_them_is_refused(tmp_path):
    data, run = sample_data(tmp_path, max_chars=20_000, num_shards=1, workers=1), tmp_path / "run"

    def train(*extra):
        return subprocess.run([sys.executable, "-m", "tpu_pretrain", "train", "--backend", "jax", "--data_dir", data,
                               "--output_dir", str(run), "--model_size", "L2-H128", "--train_batch_size", "8",
                               "--eval_every_steps", "0", "--max_eval_steps", "1", "--session_hours", "-1", *extra],
                              capture_output=True, text=True, env={**ENV, "JAX_PLATFORMS": "cpu"}, timeout=600)

    done = train("--num_train_steps", "1", "--document_masks", "on")  # the modern recipe (MLM only) on NSP pairs
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("document_masks on with sentence-pair data") == 1
    assert "its two segments never see each other" in done.stderr
    recorded = (run / "config.json").read_text()
    assert json.loads(recorded)["train"]["document_masks"] == "on"
    refused = train("--num_train_steps", "2", "--document_masks", "off")
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert (f"The run in {run} trained with document_masks on (its config.json), and resuming it with "
            "--document_masks off") in refused.stderr
    assert (run / "config.json").read_text() == recorded
