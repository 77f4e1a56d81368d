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
from fault_injection import quick_compiles
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

    def losses(t, steps=3):
        return [t.train_steps(1)["loss"] for _ in range(steps)]

    def described(t, strategy, optimizer, precision, k, losses):
        return {"strategy": strategy, "optimizer": optimizer, "precision": precision, "k": k, "losses": losses,
                "xla": t.xla,
                # the training input; the eval input is static on a TPU alone (elsewhere it keeps the last,
                # shorter batch, so that every eval sequence counts)
                "static": specs(t.train_dataset),
                "compute": sorted({l.compute_dtype for l in t.model.layers if l.weights}),
                "variables": sorted({v.dtype.name for v in t.model.weights})}

    # Each optimizer: float32 under two replicas without and with accumulation, then bfloat16 with accumulation,
    # each "float32" beside the float32 losses of the same steps. LAMB's runs under two replicas; AdamW's on one
    # device: from the float32 run's checkpoint, beside that run's next steps.
    result = {"xla_cpu": xla, "runs": []}
    for optimizer in sys.argv[4].split(","):
        float32 = {k: trainer(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]), "float32", k, optimizer)
                   for k in (1, 2)}
        start = state(float32[2])
        for k, t in float32.items():
            result["runs"].append(described(t, "two replicas", optimizer, "float32", k, losses(t)))
        if optimizer == "lamb":
            t = trainer(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]), "bfloat16", 2, optimizer)
            result["runs"].append(dict(described(t, "two replicas", optimizer, "bfloat16", 2, losses(t)),
                                       float32=result["runs"][-1]["losses"]))
            continue
        # One device: the whole replica step (forward, backward, update) is one XLA computation, as on a TPU core.
        # A checkpoint moves: two replicas, float32 -> one device, bfloat16 -> two replicas, float32.
        two, one = float32[2], trainer(tf.distribute.OneDeviceStrategy("/cpu:0"), "bfloat16", 2, optimizer)
        result["same_start"] = same(start, state(one))
        checkpoints(two).save(two.step)
        checkpoints(one).restore_latest()
        result["to_bfloat16"] = same(state(two), state(one)) and one.step == 3
        result["runs"].append(dict(described(one, "one device", optimizer, "bfloat16", 2, losses(one)),
                                   float32=losses(two)))
        checkpoints(one).save(one.step)
        back = float32[1]  # two replicas, float32 again
        checkpoints(back).restore_latest()
        result["back_to_float32"] = same(state(one), state(back)) and back.step == 6
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
    """Six trainers in one process (their compilation is the cost): per optimizer float32 at k 1 and 2 and
    bfloat16 at k 2 (AdamW's on one device, with the checkpoint moves)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(TESTS), TESTS]),
               **quick_compiles())  # these steps run a few times each
    done = subprocess.run([sys.executable, "-c", SCRIPT, data_dir, str(tmp_path_factory.mktemp("run")),
                           os.path.join(data_dir, "bert_config.json"), "adamw,lamb"],
                          capture_output=True, text=True, env=env, timeout=1200)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert lines, done.stderr[-4000:]
    return json.loads(lines[0][len("RESULT"):])


def runs_of(compiled, optimizer=None, strategy=None) -> list[dict]:
    return [run for run in compiled["runs"] if optimizer in (None, run["optimizer"])
            and strategy in (None, run["strategy"])]


@pytest.mark.parametrize("optimizer", ["adamw", "lamb"])
def test_every_configuration_trains_with_static_input_and_float32_weights(compiled, optimizer):
    runs = runs_of(compiled, optimizer)
    assert {(run["precision"], run["k"]) for run in runs} == {("float32", 1), ("float32", 2), ("bfloat16", 2)}
    for run in runs:
        assert all(np.isfinite(run["losses"])) and len(set(run["losses"])) > 1, run
        assert all(run["static"]), run  # every tensor of the distributed training input fully defined
        assert run["variables"] == ["float32"], run  # weights stay float32: checkpoints are alike
        assert ("bfloat16" in run["compute"]) == (run["precision"] == "bfloat16"), run


def test_the_training_step_compiles_with_xla_on_two_devices_for_both_optimizers_and_precisions(compiled):
    if not compiled["xla_cpu"]:
        assert TPU_BUILD, "XLA must compile on the CPU with the standard TensorFlow build"
        pytest.skip("tensorflow-tpu has no XLA backend for the CPU; the standard build's run checks compilation")
    two = runs_of(compiled, strategy="two replicas")
    assert {run["optimizer"] for run in two} == {"adamw", "lamb"}
    assert {run["precision"] for run in two} == {"float32", "bfloat16"}
    for run in two:
        assert run["xla"] == "gradients, then each variable's update", run  # jit_compile=True, and it ran
    (one,) = runs_of(compiled, strategy="one device")
    assert one["xla"] == "whole replica step"  # one XLA computation, as on a TPU core


@pytest.mark.parametrize("optimizer", ["adamw", "lamb"])
def test_bfloat16_tracks_float32_and_accumulation_changes_nothing(compiled, optimizer):
    runs = {(run["precision"], run["k"]): run for run in runs_of(compiled, optimizer)}
    bfloat16 = runs["bfloat16", 2]  # beside float32's losses of the same steps
    np.testing.assert_allclose(bfloat16["losses"], bfloat16["float32"], rtol=BFLOAT16_RTOL)
    np.testing.assert_allclose(runs["float32", 2]["losses"], runs["float32", 1]["losses"],
                               rtol=1e-4)  # the order of float32 sums only


def test_one_device_and_two_replicas_train_alike(compiled):
    """The same initial weights, and from the same checkpoint the same next losses (one device in bfloat16, two
    replicas in float32, both accumulating two micro-batches)."""
    (one,) = runs_of(compiled, strategy="one device")
    assert compiled["same_start"]
    np.testing.assert_allclose(one["losses"], one["float32"], rtol=BFLOAT16_RTOL)


def test_a_checkpoint_moves_between_strategies_and_precisions(compiled):
    """Two replicas in float32 -> one device in bfloat16 (XLA), which trains on from it -> two replicas in
    float32, exactly."""
    (one,) = runs_of(compiled, strategy="one device")
    assert compiled["to_bfloat16"] and compiled["back_to_float32"] and all(np.isfinite(one["losses"]))


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
