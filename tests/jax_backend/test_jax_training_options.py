"""What the JAX backend took over from the TensorFlow backend: the modern recipe (warmup-stable-decay, packed
MLM-only data), dynamic masking, and float16 with dynamic loss scaling (the free T4 GPUs have no bfloat16).

Trained for real on the CPU (JAX computes float16 there, slowly) from data made by create-data. Like
test_jax_stack.py these run where TensorFlow is not installed (``make test-jax-stack``); test_parity.py
compares the backends where both are.
"""

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

if importlib.util.find_spec("tensorflow") is not None or importlib.util.find_spec("bert4keras") is not None:
    pytest.skip("for the environment without TensorFlow (make test-jax-stack)", allow_module_level=True)
pytest.importorskip("jax")

from tpu_pretrain.config import Config  # noqa: E402
from tpu_pretrain.data.create import create_pretraining_data  # noqa: E402
from tpu_pretrain.data.data_folder import read_data_info  # noqa: E402
from tpu_pretrain.data.sample_corpus import write_sample_corpus  # noqa: E402
from tpu_pretrain.data.vocab import build_vocab  # noqa: E402
from tpu_pretrain.jax_backend import step  # noqa: E402
from tpu_pretrain.jax_backend.state import read_arrays  # noqa: E402
from tpu_pretrain.models.bert_config import bert_config_for_size  # noqa: E402

T = 64


@pytest.fixture(scope="module", autouse=True)
def compilation_cache(tmp_path_factory):
    """One compilation for the whole module: its trainers share their settings, so their steps compile to the
    same program, which JAX's persistent cache then serves (float16 compiles slowly on a CPU)."""
    import jax

    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")
    before = {name: getattr(jax.config, name) for name in names}
    for name, value in zip(names, (str(tmp_path_factory.mktemp("jax_cache")), 0, 0), strict=True):
        jax.config.update(name, value)
    yield
    for name, value in before.items():
        jax.config.update(name, value)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Packed, MLM-only shards at 30% masking: what ``--recipe modern`` makes; beside them, the model's
    ``bert_config.json``: one layer of L2-H128, whose float16 step compiles (slowly, on a CPU) in 3/4 of the time."""
    root = tmp_path_factory.mktemp("modern")
    corpus = write_sample_corpus(root / "corpus.txt", max_chars=40_000)
    vocab = build_vocab(Config.load(input=[str(corpus)], vocab_size=1000, num_unused_tokens=5, output_dir=str(root)))
    create_pretraining_data(Config.load(input=[str(corpus)], vocab_file=vocab.path, output_dir=str(root / "data"),
                                        recipe="modern", max_seq_length=T, dupe_factor=1, num_shards=2,
                                        eval_fraction=0.1, workers=1))
    model = bert_config_for_size("L2-H128", read_data_info(str(root / "data")).vocab_size)
    model.num_hidden_layers = 1
    model.to_json_file(root / "bert_config.json")
    return str(root / "data")


def settings(data_dir, output_dir, **overrides) -> dict:
    model = str(Path(data_dir).parent / "bert_config.json")
    values = dict(data_dir=data_dir, output_dir=str(output_dir), recipe="modern", bert_config_file=model,
                  train_batch_size=8, num_train_steps=8, num_warmup_steps=2, num_cooldown_steps=3, learning_rate=2e-3,
                  mixed_precision="float16", dynamic_masking=True, hidden_dropout_prob=0.1, steps_per_execution=4,
                  accelerator="cpu", train_seed=3)
    return {**values, **overrides}


def trainer_for(values: dict):
    from tpu_pretrain.jax_backend.trainer import JaxTrainer

    return JaxTrainer(Config.load(**values))


def set_loss_scale(trainer, scale=None, good_steps=None) -> None:
    import jax

    current = trainer.state["loss_scale"]
    trainer.state["loss_scale"] = jax.device_put({
        "scale": np.float32(current["scale"] if scale is None else scale),
        "good_steps": np.int32(current["good_steps"] if good_steps is None else good_steps)},
        trainer.devices.replicated())


def loss_scale(trainer) -> tuple[float, int]:
    return float(trainer.state["loss_scale"]["scale"]), int(trainer.state["loss_scale"]["good_steps"])


def host(tree):
    import jax

    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def test_the_modern_recipe_trains_with_dynamic_masks_in_float16_and_resumes_exactly(data_dir, tmp_path):
    """``--backend jax --recipe modern --dynamic_masking --mixed_precision float16`` (refused before) trains, and a
    run stopped at step 4 of 8 ends as the uninterrupted run does: the same masks (keyed by example id), dropout,
    loss scale and warmup-stable-decay rates across the checkpoint, through the real loop."""
    from tpu_pretrain.training import train

    values = settings(data_dir, tmp_path / "whole", save_checkpoints_steps=4, log_every_steps=4, eval_every_steps=0,
                      max_eval_steps=1, session_hours=-1, backend="jax")
    whole = train(**values, progress=False)
    assert whole.steps == 8
    print("MLM loss", whole.initial_eval["mlm_loss"], "->", whole.final_eval["mlm_loss"])
    assert whole.final_eval["mlm_loss"] < whole.initial_eval["mlm_loss"] - 0.05
    rates = [entry["learning_rate"] for entry in whole.history]  # the rates of steps 4 and 8 (0-based 3, 7)
    assert rates == pytest.approx([2e-3, 2e-3 / 3], rel=1e-6)  # stable, then in the cool-down from step 5
    recorded = json.loads((tmp_path / "whole" / "config.json").read_text())["train"]
    assert recorded["lr_schedule"] == "wsd" and recorded["dynamic_masking"] and recorded["backend"] == "jax"
    checkpoints = tmp_path / "whole" / "checkpoints"
    metadata = json.loads((checkpoints / "ckpt-000000008" / "checkpoint.json").read_text())["metadata"]
    assert metadata["lr_schedule"]["kind"] == "wsd" and metadata["lr_schedule"]["decay_start"] == 5
    expected = read_arrays(checkpoints / "ckpt-000000008")
    assert float(expected["loss_scale/scale"]) == 2.0**15 and int(expected["loss_scale/good_steps"]) == 8

    shutil.copytree(tmp_path / "whole", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "ckpt-000000008")  # as if stopped after step 4
    resumed = train(**{**values, "output_dir": str(tmp_path / "resumed")}, progress=False)
    assert resumed.steps == 8 and resumed.initial_eval is None  # it went on from step 4
    assert resumed.history[-1]["loss"] == pytest.approx(whole.history[-1]["loss"], rel=1e-6)
    got = read_arrays(tmp_path / "resumed" / "checkpoints" / "ckpt-000000008")
    assert got.keys() == expected.keys()
    for name in expected:  # weights, moments, dropout's RNG state, step, loss scale and its count of good steps
        np.testing.assert_allclose(got[name], expected[name], atol=1e-6, rtol=0, err_msg=name)


def test_float16_skips_overflowing_steps_halves_the_scale_and_keeps_it_in_the_checkpoint(data_dir, tmp_path):
    from tpu_pretrain.jax_backend.input import BATCH_FEATURES, eval_batches

    values = settings(data_dir, tmp_path)
    trainer = trainer_for(values)
    assert trainer.model.blocks[0].compute_dtype == "float16" and trainer.precision == "float16"
    assert loss_scale(trainer) == (2.0**15, 0)
    trainer.start_input(0)  # the training input masks afresh, at the recipe's 30%
    assert trainer.train_batches.masking is not None and trainer.train_batches.masking.masked_lm_prob == 0.3
    trainer.close()
    batch = next(eval_batches(trainer.data.train_files, 8, T, trainer.config.data.max_predictions_per_seq))
    trainer.train_batches = iter([(np.arange(8), {k: batch[k] for k in BATCH_FEATURES})] * 8)

    set_loss_scale(trainer, 2.0**40)  # 2**40 down to 2**37: the scaled gradients overflow float16 at every step
    before = host([trainer.state["params"], trainer.state["slots"]])
    skipped = trainer.train_steps(4)
    after = host([trainer.state["params"], trainer.state["slots"]])
    assert trainer.step == 4 and loss_scale(trainer) == (2.0**36, 0)  # skipped and counted, halved each time
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))  # weights and moments unchanged

    set_loss_scale(trainer, 2.0**15, step.LOSS_SCALE_GROWTH_STEPS - 1)
    learned = trainer.train_steps(4)
    assert loss_scale(trainer) == (2.0**16, 3)  # doubled after 2000 finite steps, then counting again
    print(f"float16 loss on one batch: {skipped['loss']:.4f} while skipping, {learned['loss']:.4f} after")
    assert np.isfinite(learned["loss"]) and learned["loss"] < skipped["loss"] - 0.05
    assert trainer.weights_finite() and all(p.dtype == np.float32 for p in trainer.state["params"])

    trainer.checkpoint_state().write(tmp_path)
    saved = read_arrays(tmp_path)
    assert float(saved["loss_scale/scale"]) == 2.0**16 and int(saved["loss_scale/good_steps"]) == 3
    restored = trainer_for(values)
    restored.checkpoint_state().read(tmp_path)
    assert loss_scale(restored) == (2.0**16, 3) and restored.step == 8
    older = {k: v for k, v in saved.items() if not k.startswith("loss_scale/")}  # before loss scaling, or float32
    np.savez(tmp_path / "state.npz", **older)
    restored.checkpoint_state().read(tmp_path)
    assert loss_scale(restored) == (2.0**15, 0) and restored.step == 8
    np.savez(tmp_path / "state.npz", **saved)
    in_float32 = trainer_for({**values, "mixed_precision": "float32"})  # a float16 checkpoint resumed in float32
    in_float32.checkpoint_state().read(tmp_path)
    assert "loss_scale" not in in_float32.state and in_float32.step == 8
    trainer.close()
