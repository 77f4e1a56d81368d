"""The training step as a TPU compiles it, checked on the CPU: XLA (jit_compile=True) under MirroredStrategy over
two logical devices, float32 and bfloat16, AdamW and LAMB, with and without accumulation; static shapes in the
distributed input; token ids checked against the vocab on the host; checkpoints moving between strategies and
precisions. Each script runs in a subprocess: logical devices must be configured before TensorFlow starts."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from pretraining_fixtures import synthetic_data_folder, synthetic_instances, write_shards

from tpu_pretrain.data.data_folder import MANIFEST, check_token_ids, read_data_info
from tpu_pretrain.environment import installed_version
from tpu_pretrain.errors import UserInputError

TPU_BUILD = installed_version("tensorflow-tpu") is not None
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
V, T, P = 200, 32, 5
TINY = {"vocab_size": V, "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 128, "max_position_embeddings": 64}
# bfloat16 keeps 8 bits of mantissa; the loss (computed in float32 from the logits) follows float32's closely.
# Measured when written: at most 1.3e-4 relative over these steps; the tolerance is 15 times that (longer runs:
# benchmarks/bench_bfloat16.py).
BFLOAT16_RTOL = 2e-3

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tpu_pretrain
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from tpu_pretrain.config import Config
    from tpu_pretrain.tf_backend.accelerator import Accelerator
    from tpu_pretrain.core.checkpoints import CheckpointManager
    from tpu_pretrain.tf_backend.trainer import Trainer

    data_dir, out, bert_config = sys.argv[1:4]
    try:  # the TPU build has no XLA backend for the CPU ("could not find registered transfer manager")
        tf.function(lambda: tf.constant(2.0) * 2, jit_compile=True)()
        xla = True
    except tf.errors.NotFoundError:
        xla = False

    def trainer(strategy, precision, k, optimizer="adamw"):
        config = Config.load(data_dir=data_dir, output_dir=out, bert_config_file=bert_config, train_batch_size=8,
                             num_train_steps=10, num_warmup_steps=0, learning_rate=1e-3, hidden_dropout_prob=0.0,
                             gradient_accumulation_steps=k, shuffle_buffer_size=64, optimizer=optimizer,
                             max_eval_steps=1)
        return Trainer(config, Accelerator("cpu", strategy, precision, jit_compile=xla))

    def specs(dataset):
        return [s.shape.is_fully_defined() for s in tf.nest.flatten(dataset.element_spec, expand_composites=True)]

    def state(t):
        return [v.numpy().astype(np.float64) for v in t.model.weights + t.optimizer.variables]

    def same(a, b):
        return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))

    def checkpoints(t):
        return CheckpointManager(out + "/checkpoints", t.checkpoint_state())

    result, trainers = {"xla_cpu": xla}, {}
    for optimizer in ("adamw", "lamb"):
        for k in (1, 2):
            for precision in ("float32", "bfloat16"):
                t = trainers[optimizer, precision, k] = trainer(
                    tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]), precision, k, optimizer)
                result[f"{optimizer}/{precision}/{k}"] = {
                    "losses": [t.train_steps(1)["loss"] for _ in range(3)], "xla": t.xla,
                    # the training input; the eval input is static on a TPU alone (elsewhere it keeps the last,
                    # shorter batch, so that every eval sequence counts)
                    "static": specs(t.train_dataset),
                    "compute": sorted({l.compute_dtype for l in t.model.layers if l.weights}),
                    "variables": sorted({v.dtype.name for v in t.model.weights})}
    # One device: the whole replica step (forward, backward, update) is one XLA computation, as on a TPU core.
    one = trainer(tf.distribute.OneDeviceStrategy("/cpu:0"), "bfloat16", 2)
    result["one-device"] = {"losses": [one.train_steps(1)["loss"] for _ in range(3)], "xla": one.xla}
    # A checkpoint saved under one strategy and precision restores under another, and back.
    saved = trainers["adamw", "float32", 1]  # two replicas, float32
    checkpoints(saved).save(saved.step)
    restored = trainer(tf.distribute.OneDeviceStrategy("/cpu:0"), "bfloat16", 1)  # one device, bfloat16
    checkpoints(restored).restore_latest()
    result["to_bfloat16"] = same(state(saved), state(restored)) and restored.step == 3
    result["after_restore"] = restored.train_steps(1)["loss"]
    checkpoints(restored).save(restored.step)
    back = trainers["adamw", "float32", 2]  # two replicas, float32 again
    checkpoints(back).restore_latest()
    result["back_to_float32"] = same(state(restored), state(back)) and back.step == 4
    print("RESULT" + json.dumps(result))
""")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = synthetic_data_folder(str(tmp_path_factory.mktemp("data")), 128, 16, T, P, V)
    with open(os.path.join(folder, "bert_config.json"), "w") as handle:
        json.dump(TINY, handle)
    return folder


@pytest.fixture(scope="module")
def compiled(data_dir, tmp_path_factory) -> dict:
    """Nine trainers in one process (their compilation is the cost): the matrix, one device, checkpoints."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(TESTS), TESTS]))
    done = subprocess.run([sys.executable, "-c", SCRIPT, data_dir, str(tmp_path_factory.mktemp("run")),
                           os.path.join(data_dir, "bert_config.json")],
                          capture_output=True, text=True, env=env, timeout=1200)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert lines, done.stderr[-4000:]
    return json.loads(lines[0][len("RESULT"):])


@pytest.mark.parametrize("optimizer", ["adamw", "lamb"])
def test_every_configuration_trains_with_static_input_and_float32_weights(compiled, optimizer):
    for k in (1, 2):
        for precision in ("float32", "bfloat16"):
            run = compiled[f"{optimizer}/{precision}/{k}"]
            assert all(np.isfinite(run["losses"])) and len(set(run["losses"])) > 1, run
            assert all(run["static"]), run  # every tensor of the distributed training input fully defined
            assert run["variables"] == ["float32"], run  # weights stay float32: checkpoints are alike
            assert ("bfloat16" in run["compute"]) == (precision == "bfloat16"), run


def test_the_training_step_compiles_with_xla_on_two_devices_for_both_optimizers_and_precisions(compiled):
    if not compiled["xla_cpu"]:
        assert TPU_BUILD, "XLA must compile on the CPU with the standard TensorFlow build"
        pytest.skip("tensorflow-tpu has no XLA backend for the CPU; the standard build's run checks compilation")
    for key, run in compiled.items():
        if key.count("/") == 2:  # optimizer/precision/accumulation, all under MirroredStrategy
            assert run["xla"] == "gradients, then each variable's update", key  # jit_compile=True, and it ran
    assert compiled["one-device"]["xla"] == "whole replica step"  # one XLA computation, as on a TPU core


@pytest.mark.parametrize("optimizer", ["adamw", "lamb"])
def test_bfloat16_tracks_float32_and_accumulation_changes_nothing(compiled, optimizer):
    runs = {key.split("/", 1)[1]: run["losses"] for key, run in compiled.items() if key.startswith(optimizer + "/")}
    for k in (1, 2):
        np.testing.assert_allclose(runs[f"bfloat16/{k}"], runs[f"float32/{k}"], rtol=BFLOAT16_RTOL)
    np.testing.assert_allclose(runs["float32/2"], runs["float32/1"], rtol=1e-4)  # the order of float32 sums only


def test_one_device_and_two_replicas_train_alike(compiled):
    np.testing.assert_allclose(compiled["one-device"]["losses"], compiled["adamw/float32/2"]["losses"],
                               rtol=BFLOAT16_RTOL)


def test_a_checkpoint_moves_between_strategies_and_precisions(compiled):
    """Two replicas in float32 -> one device in bfloat16 (XLA) -> two replicas in float32, exactly."""
    assert compiled["to_bfloat16"] and compiled["back_to_float32"] and np.isfinite(compiled["after_restore"])


def test_token_ids_beyond_the_models_vocab_are_refused_on_the_host(data_dir, tmp_path):
    """XLA's gather on a TPU clamps out-of-range ids silently, so the host checks the records first."""
    info = read_data_info(data_dir)
    check_token_ids(info, 25)  # the synthetic sequences use ids 0-24
    with pytest.raises(UserInputError, match=r"train-00000-of-00002.tfrecord, record \d+: (input|masked_lm)_ids holds "
                                             r"the id 2[0-4] but the model's vocab has 20 tokens"):
        check_token_ids(info, 20)
    other_tool = tmp_path / "other"  # data without a manifest, read by a model whose config says 20 tokens
    write_shards(str(other_tool), {"train": synthetic_instances(16, T, P, V)}, T, P, V)
    os.remove(other_tool / MANIFEST)
    (tmp_path / "bert_config.json").write_text(json.dumps(dict(TINY, vocab_size=20)))
    from tpu_pretrain.config import Config
    from tpu_pretrain.tf_backend.trainer import Trainer

    config = Config.load(data_dir=str(other_tool), output_dir=str(tmp_path / "run"),
                         bert_config_file=str(tmp_path / "bert_config.json"), train_batch_size=8)
    with pytest.raises(UserInputError, match="silently clamped"):
        Trainer(config)
