"""The JAX backend against the TensorFlow backend: from the same weights and batches, the same loss,
gradient norm, learning rate of every step and weights after several optimiser steps (float32 tolerance),
for AdamW and LAMB with warmup, clipping, gradient accumulation and both schedules (linear, warmup-stable-
decay); both in float16 with dynamic loss scaling, the same within float16's tolerance; and dynamic masks drawn
alike in distribution (their random streams differ).

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

from fault_injection import ENV  # noqa: E402
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
    values = dict(data_dir=data_dir, output_dir=data_dir, recipe="classic", model_size="L2-H128", train_batch_size=B,
                  num_train_steps=20, num_warmup_steps=2, learning_rate=2e-3, hidden_dropout_prob=0.0,
                  steps_per_execution=1, accelerator="cpu", mixed_precision="float32", jit_compile="off",
                  clip_norm=0.5, train_seed=5)
    return {**values, **overrides}


JAX_SIDE = textwrap.dedent("""
    import json, sys
    import numpy as np
    from tpu_pretrain.config import Config
    from tpu_pretrain.jax_backend import step
    from tpu_pretrain.jax_backend.trainer import JaxTrainer
    folder = sys.argv[1]
    trainer = JaxTrainer(Config.load(**json.load(open(folder + "/settings.json"))))
    trainer.load_stored_weights(dict(np.load(folder + "/start.npz")), "the TensorFlow model's start", strict=True)
    data = np.load(folder + "/batches.npz")
    batches = [{k: data[k][i] for k in data.files} for i in range(len(data["input_ids"]))]
    grads, stats, _ = step.gradients(trainer.spec, trainer.state, batches[0])
    ids = np.arange(len(batches[0]["input_ids"]))
    loss = stats["mlm_loss_sum"] / max(float(stats["mlm_weight"]), 1.0) + stats["nsp_loss_sum"] / len(ids)
    trainer.train_batches = iter([(ids, b) for b in batches])
    losses = [trainer.train_steps(1)["loss"] for _ in batches]
    np.savez(folder + "/after.npz", **trainer.stored_weights())
    scale = trainer.state["loss_scale"]["scale"] if "loss_scale" in trainer.state else None
    json.dump({"loss": float(loss), "norm": float(step.global_norm(grads)), "losses": losses, "step": trainer.step,
               "rates": [float(step.learning_rate(trainer.settings, s)) for s in range(trainer.step)],
               "loss_scale": None if scale is None else float(scale)}, open(folder + "/jax.json", "w"))
""")


def run_jax_side(folder, values: dict, start: dict, batches: list[dict]) -> tuple[dict, dict]:
    with open(os.path.join(folder, "settings.json"), "w") as handle:
        json.dump(values, handle)
    np.savez(os.path.join(folder, "start.npz"), **start)
    np.savez(os.path.join(folder, "batches.npz"), **{k: np.stack([b[k] for b in batches]) for k in BATCH_FEATURES})
    done = subprocess.run([sys.executable, "-c", JAX_SIDE, str(folder)], capture_output=True, text=True, timeout=600,
                          env=ENV)
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


_TF_RUNS: dict[str, dict] = {}


def tf_reference(values: dict) -> dict:
    """The TensorFlow backend's STEPS steps over the first STEPS batches: the weights it started from, the loss,
    gradient norm, per-step losses and rates, and the weights after (once per settings in this module)."""
    key = json.dumps(values, sort_keys=True)
    if key in _TF_RUNS:
        return _TF_RUNS[key]
    tf_trainer = Trainer(Config.load(**values))
    start = google_weights(tf_trainer.pretraining)
    batches = [{k: b[k] for k in BATCH_FEATURES} for b in eval_batches(tf_trainer.data.train_files, B, T, P, STEPS)]
    tf_loss, tf_norm = tf_loss_and_norm(tf_trainer, batches[0])
    ids = np.arange(B, dtype=np.int64)
    stacked = {k: np.stack([b[k] for b in batches]) for k in BATCH_FEATURES}
    tf_trainer.train_iterator = iter(tf.data.Dataset.from_tensor_slices({**stacked, "example_id": np.stack(
        [ids] * STEPS)}))
    tf_losses, tf_rates = [], []
    for _ in range(STEPS):
        tf_losses.append(tf_trainer.train_steps(1)["loss"])
        tf_rates.append(float(tf.convert_to_tensor(tf_trainer.optimizer.learning_rate)))  # the step's own rate
    _TF_RUNS[key] = {"start": start, "batches": batches, "tf_loss": tf_loss, "tf_norm": tf_norm,
                     "tf_losses": tf_losses, "tf_rates": tf_rates, "tf_step": tf_trainer.step,
                     "tf_after": google_weights(tf_trainer.pretraining),
                     "tf_loss_scale": float(getattr(tf_trainer.optimizer, "loss_scale", 0.0))}
    return _TF_RUNS[key]


def train_both(values: dict, tmp_path, **jax_overrides) -> dict:
    """Both backends from the TensorFlow model's initial weights over the same STEPS batches: what each gives."""
    run = dict(tf_reference(values))
    run["jax"], run["jax_after"] = run_jax_side(tmp_path, {**values, **jax_overrides}, run["start"], run["batches"])
    print(f"loss {run['tf_loss']:.7f} vs {run['jax']['loss']:.7f}; gradient norm {run['tf_norm']:.7f} vs "
          f"{run['jax']['norm']:.7f}")
    return run


def weight_differences(run: dict) -> tuple[float, float]:
    """How far the TensorFlow run's weights moved, and the largest difference between the backends."""
    start, tf_after, jax_after = run["start"], run["tf_after"], run["jax_after"]
    assert tf_after.keys() == jax_after.keys()
    moved = max(float(np.max(np.abs(tf_after[n] - start[n]))) for n in start)
    worst = max(float(np.max(np.abs(tf_after[n] - jax_after[n]))) for n in start)
    return moved, worst


WSD = dict(lr_schedule="wsd", num_train_steps=5, num_warmup_steps=1, num_cooldown_steps=3)  # rates 0, p, p, 2p/3


@pytest.mark.slow
@pytest.mark.parametrize("optimizer,accumulation,schedule", [("adamw", 1, {}), ("lamb", 2, WSD)])
def test_same_weights_and_batches_give_the_same_loss_gradients_and_updates(data_dir, tmp_path, optimizer,
                                                                          accumulation, schedule):
    values = settings(data_dir, optimizer=optimizer, gradient_accumulation_steps=accumulation, **schedule)
    run = train_both(values, tmp_path)
    jax_side = run["jax"]
    assert jax_side["loss"] == pytest.approx(run["tf_loss"], rel=1e-5)
    assert jax_side["norm"] == pytest.approx(run["tf_norm"], rel=1e-4)
    assert run["tf_norm"] > values["clip_norm"]  # clipping is exercised
    np.testing.assert_allclose(jax_side["losses"], run["tf_losses"], rtol=2e-5)
    assert jax_side["step"] == run["tf_step"] == STEPS
    # The rate of every update, from the core's schedule in each backend.
    np.testing.assert_allclose(jax_side["rates"], run["tf_rates"], rtol=1e-6, atol=1e-12)
    if schedule:
        rates = jax_side["rates"]
        assert rates[0] < rates[1] == rates[2] > rates[3] > 0  # warmup, stable, cool-down
    moved, worst = weight_differences(run)
    print(f"{optimizer}: weights moved up to {moved:.3g}; backends differ by up to {worst:.3g}")
    assert moved > 1e-3
    for name in run["start"]:
        np.testing.assert_allclose(run["jax_after"][name], run["tf_after"][name], atol=2e-5, rtol=0, err_msg=name)


@pytest.mark.slow
def test_float16_with_dynamic_loss_scaling_trains_alike_in_both_backends(data_dir, tmp_path):
    """Both backends in float16 (float32 weights, dynamic loss scaling: what ``auto`` takes on a GPU with float16
    tensor cores and no bfloat16, the free T4) from the same weights and batches: the same training within float16's
    precision, each within it of TensorFlow's float32 steps. TensorFlow's float16 model did not build before its tied
    MLM head read the table in float16 (``TiedEmbedding``)."""
    run = train_both(settings(data_dir, mixed_precision="float16"), tmp_path)
    exact = tf_reference(settings(data_dir))
    assert all(np.array_equal(exact["start"][n], run["start"][n]) for n in run["start"])  # one start for all three
    jax_side = run["jax"]
    assert jax_side["loss_scale"] == run["tf_loss_scale"] == 2.0**15  # no step overflowed: still the initial scale
    for losses in (jax_side["losses"], run["tf_losses"]):
        np.testing.assert_allclose(losses, exact["tf_losses"], rtol=5e-4)
    assert jax_side["loss"] == pytest.approx(run["tf_loss"], rel=5e-4)
    assert jax_side["norm"] == pytest.approx(run["tf_norm"], rel=2e-3)
    moved, worst = weight_differences(run)
    print(f"float16: losses {np.round(run['tf_losses'], 5)} vs {np.round(jax_side['losses'], 5)} (float32: "
          f"{np.round(exact['tf_losses'], 5)}); weights moved up to {moved:.3g}; backends differ by up to {worst:.3g}")
    assert moved > 1e-3 and worst < 0.1 * moved


def test_dynamic_masks_are_drawn_alike_in_both_backends(data_dir):
    """Same counts per sequence, same restored text; selection spread evenly over the real tokens and 80/10/10
    replacements in both (TensorFlow's stateless draws and the JAX input's NumPy ones)."""
    from tpu_pretrain.data.data_folder import read_data_info
    from tpu_pretrain.data.dynamic_masking import DynamicMasking, dynamic_mask
    from tpu_pretrain.data.vocab import Vocab
    from tpu_pretrain.tf_backend.input import dynamic_mask as tf_dynamic_mask

    spec = DynamicMasking.from_vocab(Vocab.read(os.path.join(data_dir, "vocab.txt")))
    batch = next(eval_batches(read_data_info(data_dir).train_files, 64, T, P, 1))
    original = restored(batch)
    candidates = (batch["input_mask"] > 0) & (original != spec.cls_id) & (original != spec.sep_id)
    n_candidates = candidates.sum(axis=1)
    n_mask = np.round(n_candidates.astype(np.float32) * np.float32(0.15))  # in float32, as TensorFlow rounds
    n_mask = np.minimum(np.maximum(n_mask, 1), np.minimum(P, n_candidates))
    expected = np.mean(candidates * (n_mask / n_candidates)[:, None], axis=0)  # each position's chance

    def in_tensorflow(seed):
        out = tf_dynamic_mask({k: tf.constant(v) for k, v in batch.items()}, tf.constant([seed, 7], tf.int64), spec)
        return {k: v.numpy() for k, v in out.items()}

    def in_numpy(seed):
        return dynamic_mask(batch, np.arange(64) + (seed << 48), 5, spec)  # epoch ``seed`` of 64 examples

    draws = 60
    for name, mask in (("TensorFlow", in_tensorflow), ("NumPy", in_numpy)):
        chosen = np.zeros((64, T))
        written = {"mask": 0, "kept": 0, "random": 0}
        for s in range(draws):
            out = mask(s)
            weights = out["masked_lm_weights"] > 0
            np.testing.assert_array_equal(weights.sum(axis=1), n_mask)  # as many masks per sequence
            np.testing.assert_array_equal(restored(out), original)  # over the same text
            rows, slots = np.nonzero(weights)
            positions, labels = out["masked_lm_positions"][rows, slots], out["masked_lm_ids"][rows, slots]
            chosen[rows, positions] += 1
            tokens = out["input_ids"][rows, positions]
            written["mask"] += int(np.sum(tokens == spec.mask_id))
            written["kept"] += int(np.sum(tokens == labels))
            written["random"] += int(np.sum((tokens != spec.mask_id) & (tokens != labels)))
        total = sum(written.values())
        shares = {k: round(v / total, 3) for k, v in written.items()}
        spread = float(np.max(np.abs(chosen.mean(axis=0) / draws - expected)))
        print(f"{name}: {shares} of {total}; chance per position off by up to {spread:.3f}")
        assert not np.any(chosen[~candidates])  # never [CLS], [SEP] or padding
        assert spread < 0.03
        assert abs(shares["mask"] - 0.8) < 0.02 and abs(shares["kept"] - 0.1) < 0.02


def restored(features: dict) -> np.ndarray:
    """The sequences with their masks undone."""
    ids = np.array(features["input_ids"])
    rows, slots = np.nonzero(features["masked_lm_weights"] > 0)
    ids[rows, features["masked_lm_positions"][rows, slots]] = features["masked_lm_ids"][rows, slots]
    return ids
def cli(*args):
    done = subprocess.run([sys.executable, "-m", "tpu_pretrain", *args], capture_output=True, text=True, timeout=600,
                          env=ENV)  # TF_DETERMINISTIC_OPS=1 among them: `export --format tf` builds a seeded model
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_weights_move_between_the_backends_through_the_exports(data_dir, tmp_path):
    """A TensorFlow run's Google export starts a JAX run whose step-0 held-out figures are the TensorFlow run's
    final ones; that JAX run's weights, evaluated by the TensorFlow model, give its own figures again."""
    common = ["--data_dir", data_dir, "--model_size", "L2-H128", "--train_batch_size", str(B), "--num_warmup_steps",
              "1", "--save_checkpoints_steps", "4", "--eval_every_steps", "0", "--session_hours", "-1",
              "--max_eval_steps", "2", "--recipe", "classic"]
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
