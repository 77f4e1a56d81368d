"""The JAX backend against the TensorFlow backend: from the same weights and batches, the same loss,
gradient norm and weights after several optimiser steps (float32 tolerance), for AdamW and LAMB with
warmup, clipping and gradient accumulation.

The JAX side runs in a subprocess: bert4keras makes the name ``keras`` mean tf-keras in its process, so
the two backends do not share one Python process (each refuses, saying so).
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tpu_pretrain  # noqa: F401  (selects Keras 2 for TensorFlow)

tf = pytest.importorskip("tensorflow")  # this compares the backends: the environment with both
pytest.importorskip("jax")

from pretraining_fixtures import synthetic_instances, write_shards, write_vocab  # noqa: E402

from tpu_pretrain.config import Config  # noqa: E402
from tpu_pretrain.jax_backend.input import BATCH_FEATURES, eval_batches  # noqa: E402
from tpu_pretrain.tf_backend.stats import pretraining_stats  # noqa: E402
from tpu_pretrain.tf_backend.trainer import Trainer  # noqa: E402
from tpu_pretrain.tf_backend.weights import google_weights  # noqa: E402

V, T, P, B, STEPS = 300, 32, 5, 8, 4


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("parity"))
    write_shards(folder, {"train": synthetic_instances(64, T, P, V), "eval": synthetic_instances(16, T, P, V, 1)},
                 T, P, V)
    write_vocab(os.path.join(folder, "vocab.txt"), V)
    return folder


def settings(data_dir, **overrides) -> dict:
    values = dict(data_dir=data_dir, output_dir=data_dir, model_size="L2-H128", train_batch_size=B,
                  num_train_steps=20, num_warmup_steps=2, learning_rate=2e-3, hidden_dropout_prob=0.0,
                  steps_per_execution=1, accelerator="cpu", mixed_precision="float32", jit_compile="off",
                  clip_norm=0.5, train_seed=5)
    return {**values, **overrides}


JAX_SIDE = textwrap.dedent("""
    import json, sys
    import numpy as np
    from tpu_pretrain.config import Config
    from tpu_pretrain.jax_backend import optimizer as opt
    from tpu_pretrain.jax_backend.trainer import JaxTrainer
    folder = sys.argv[1]
    trainer = JaxTrainer(Config.load(**json.load(open(folder + "/settings.json"))))
    trainer.set_google_weights(dict(np.load(folder + "/start.npz")))
    data = np.load(folder + "/batches.npz")
    batches = [{k: data[k][i] for k in data.files} for i in range(len(data["input_ids"]))]
    grads, stats, _ = trainer.gradients(trainer.state, batches[0])
    ids = np.arange(len(batches[0]["input_ids"]))
    loss = stats["mlm_loss_sum"] / max(float(stats["mlm_weight"]), 1.0) + stats["nsp_loss_sum"] / len(ids)
    trainer.train_batches = iter([(ids, b) for b in batches])
    losses = [trainer.train_steps(1)["loss"] for _ in batches]
    np.savez(folder + "/after.npz", **trainer.google_weights())
    json.dump({"loss": float(loss), "norm": float(opt.global_norm(grads)), "losses": losses,
               "learning_rate": float(opt.learning_rate(trainer.settings, trainer.step - 1)), "step": trainer.step},
              open(folder + "/jax.json", "w"))
""")


def run_jax_side(folder, values: dict, start: dict, batches: list[dict]) -> tuple[dict, dict]:
    with open(os.path.join(folder, "settings.json"), "w") as handle:
        json.dump(values, handle)
    np.savez(os.path.join(folder, "start.npz"), **start)
    np.savez(os.path.join(folder, "batches.npz"), **{k: np.stack([b[k] for b in batches]) for k in BATCH_FEATURES})
    done = subprocess.run([sys.executable, "-c", JAX_SIDE, str(folder)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(os.path.join(folder, "jax.json")) as handle:
        return json.load(handle), dict(np.load(os.path.join(folder, "after.npz")))


def tf_loss_and_norm(trainer: Trainer, batch: dict) -> tuple[float, float]:
    tensors = {k: tf.constant(v) for k, v in batch.items()}
    with tf.GradientTape() as tape:
        outputs = trainer.model([tensors["input_ids"], tensors["segment_ids"], tensors["masked_lm_positions"]],
                                training=True)
        stats = pretraining_stats(outputs, tensors, with_nsp=True)
        loss = stats["mlm_loss_sum"] / tf.maximum(stats["mlm_weight"], 1.0) + stats["nsp_loss_sum"] / B
    grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, trainer.model.trainable_variables)]
    return float(loss), float(tf.linalg.global_norm(grads))


@pytest.mark.slow
@pytest.mark.parametrize("optimizer,accumulation", [("adamw", 1), ("lamb", 2)])
def test_same_weights_and_batches_give_the_same_loss_gradients_and_updates(data_dir, tmp_path, optimizer,
                                                                          accumulation):
    values = settings(data_dir, optimizer=optimizer, gradient_accumulation_steps=accumulation)
    tf_trainer = Trainer(Config.load(**values))
    start = google_weights(tf_trainer.pretraining)
    batches = [{k: b[k] for k in BATCH_FEATURES} for b in eval_batches(tf_trainer.data.train_files, B, T, P, STEPS)]
    jax_side, jax_after = run_jax_side(tmp_path, values, start, batches)

    tf_loss, tf_norm = tf_loss_and_norm(tf_trainer, batches[0])
    print(f"loss {tf_loss:.7f} vs {jax_side['loss']:.7f}; gradient norm {tf_norm:.7f} vs {jax_side['norm']:.7f}")
    assert jax_side["loss"] == pytest.approx(tf_loss, rel=1e-5)
    assert jax_side["norm"] == pytest.approx(tf_norm, rel=1e-4)
    assert tf_norm > values["clip_norm"]  # clipping is exercised

    ids = np.arange(B, dtype=np.int64)
    stacked = {k: np.stack([b[k] for b in batches]) for k in BATCH_FEATURES}
    tf_trainer.train_iterator = iter(tf.data.Dataset.from_tensor_slices({**stacked, "example_id": np.stack(
        [ids] * STEPS)}))
    tf_losses = [tf_trainer.train_steps(1)["loss"] for _ in range(STEPS)]
    np.testing.assert_allclose(jax_side["losses"], tf_losses, rtol=2e-5)
    assert jax_side["step"] == tf_trainer.step == STEPS
    assert jax_side["learning_rate"] == pytest.approx(float(tf.convert_to_tensor(tf_trainer.optimizer.learning_rate)),
                                                      rel=1e-6)  # the last update's, from the core's schedule in each
    tf_after = google_weights(tf_trainer.pretraining)
    assert tf_after.keys() == jax_after.keys()
    moved = max(float(np.max(np.abs(tf_after[n] - start[n]))) for n in start)
    worst = max(float(np.max(np.abs(tf_after[n] - jax_after[n]))) for n in start)
    print(f"{optimizer}: weights moved up to {moved:.3g}; backends differ by up to {worst:.3g}")
    assert moved > 1e-3
    for name in start:
        np.testing.assert_allclose(jax_after[name], tf_after[name], atol=2e-5, rtol=0, err_msg=name)


def cli(*args):
    done = subprocess.run([sys.executable, "-m", "tpu_pretrain", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_weights_move_between_the_backends_through_the_exports(data_dir, tmp_path):
    """A TensorFlow run's Google export starts a JAX run whose step-0 held-out figures are the TensorFlow run's
    final ones; that JAX run's weights, evaluated by the TensorFlow model, give its own figures again."""
    common = ["--data_dir", data_dir, "--model_size", "L2-H128", "--train_batch_size", str(B), "--num_warmup_steps",
              "1", "--save_checkpoints_steps", "4", "--eval_every_steps", "0", "--session_hours", "-1",
              "--max_eval_steps", "2"]
    tf_run, jax_run = tmp_path / "tf", tmp_path / "jax"
    cli("train", "--output_dir", str(tf_run), "--num_train_steps", "4", *common)
    cli("export", str(tf_run), "--format", "tf")
    cli("train", "--backend", "jax", "--output_dir", str(jax_run), "--num_train_steps", "4",
        "--init_checkpoint", str(tf_run / "export" / "tf" / "bert_model.ckpt"), *common)
    tf_final = json.loads((tf_run / "train_summary.json").read_text())["final_eval"]
    jax_summary = json.loads((jax_run / "train_summary.json").read_text())
    for key in ("mlm_loss", "mlm_accuracy", "nsp_loss"):
        assert jax_summary["initial_eval"][key] == pytest.approx(tf_final[key], rel=1e-5), key
    evaluated = cli("evaluate", str(jax_run), "--data_dir", data_dir, "--max_eval_steps", "2", "--eval_batch_size",
                    str(B))
    figures = json.loads((jax_run / "evaluation.json").read_text())["metrics"]
    assert "step 4" in evaluated
    for key in ("mlm_loss", "mlm_accuracy", "nsp_loss"):
        assert figures[key] == pytest.approx(jax_summary["final_eval"][key], rel=1e-5), key
