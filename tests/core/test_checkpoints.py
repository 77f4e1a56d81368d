"""The checkpoint manager on real TensorFlow checkpoints: atomic writes, fallback, full disk (the mirror and the
space it may use: test_durable_copy.py)."""

import subprocess

import numpy as np
import pytest

import tpu_pretrain  # noqa: F401  (Keras 2 before TensorFlow)

import tensorflow as tf  # isort: skip

from tpu_pretrain.core.checkpoints import (
    CheckpointError,
    CheckpointManager,
    DamagedCheckpointsError,
    find_checkpoint,
    verify,
)
from tpu_pretrain.tf_backend.state import TensorFlowState


def make_state(seed=0, width=64):
    tf.keras.utils.set_random_seed(seed)
    model = tf.keras.Sequential([tf.keras.Input((width,)), tf.keras.layers.Dense(width), tf.keras.layers.Dense(4)])
    optimizer = tf.keras.optimizers.Adam(1e-2)
    optimizer.build(model.trainable_variables)
    return model, optimizer, TensorFlowState(tf.train.Checkpoint(model=model, optimizer=optimizer))


def train_a_step(model, optimizer):
    x = tf.random.normal((8, model.input_shape[-1]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(x) ** 2)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))


def weights(model):
    return [w.copy() for w in model.get_weights()]


def test_save_restore_round_trip_and_pruning(tmp_path):
    model, optimizer, checkpoint = make_state()
    manager = CheckpointManager(tmp_path / "checkpoints", checkpoint, keep_max=2)
    for step in (1, 2, 3):
        train_a_step(model, optimizer)
        manager.save(step, {"examples": step * 8})
    saved = weights(model)
    assert [c.step for c in manager.local_checkpoints()] == [3, 2]  # keep_max
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "ckpt-000000003"
    model2, optimizer2, checkpoint2 = make_state(seed=1)
    info = CheckpointManager(tmp_path / "checkpoints", checkpoint2).restore_latest()
    assert info.step == 3 and info.metadata == {"examples": 24}
    assert int(optimizer2.iterations) == 3
    for a, b in zip(saved, weights(model2), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_a_damaged_checkpoint_falls_back_to_the_previous_one(tmp_path, damage, caplog):
    model, optimizer, checkpoint = make_state()
    manager = CheckpointManager(tmp_path / "checkpoints", checkpoint)
    train_a_step(model, optimizer)
    manager.save(1)
    first = weights(model)
    train_a_step(model, optimizer)
    manager.save(2)
    data = next((tmp_path / "checkpoints" / "ckpt-000000002").glob("state.data-*"))
    if damage == "truncate":
        data.write_bytes(data.read_bytes()[:100])
    else:
        data.unlink()
    damaged_files = sorted(p.name for p in (tmp_path / "checkpoints" / "ckpt-000000002").iterdir())
    model2, _, checkpoint2 = make_state(seed=3)
    info = CheckpointManager(tmp_path / "checkpoints", checkpoint2).restore_latest()
    assert info.step == 1
    assert "ckpt-000000002 is damaged" in caplog.text and "checkpoints/damaged/ckpt-000000002" in caplog.text
    for a, b in zip(first, weights(model2), strict=True):
        np.testing.assert_array_equal(a, b)
    assert find_checkpoint(tmp_path / "checkpoints").step == 1
    # Set aside, not deleted: a later save of step 2 cannot overwrite it, and pruning never sees it.
    kept = tmp_path / "checkpoints" / "damaged" / "ckpt-000000002"
    assert sorted(p.name for p in kept.iterdir()) == sorted(damaged_files + ["DAMAGED.txt"])
    assert ("is missing" if damage == "delete" else "has 100 bytes") in (kept / "DAMAGED.txt").read_text()


def test_when_every_checkpoint_is_damaged_nothing_is_touched_until_asked(tmp_path):
    model, optimizer, checkpoint = make_state()
    manager = CheckpointManager(tmp_path / "checkpoints", checkpoint)
    for step in (1, 2):
        train_a_step(model, optimizer)
        manager.save(step)
    for data in (tmp_path / "checkpoints").glob("ckpt-*/state.data-*"):
        data.write_bytes(b"\0" * data.stat().st_size)  # same size, other bytes: only the CRC32C tells
    before = {p: p.read_bytes() for p in (tmp_path / "checkpoints").rglob("*") if p.is_file()}
    _, _, fresh = make_state(seed=4)
    with pytest.raises(DamagedCheckpointsError, match=r"Every checkpoint .*ckpt-000000002: .*CRC32C.*"
                                                      r"--set_aside_damaged_checkpoints"):
        CheckpointManager(tmp_path / "checkpoints", fresh).restore_latest()
    assert {p: p.read_bytes() for p in (tmp_path / "checkpoints").rglob("*") if p.is_file()} == before
    assert CheckpointManager(tmp_path / "checkpoints", fresh).restore_latest(set_aside_damaged=True) is None
    assert sorted(p.name for p in (tmp_path / "checkpoints" / "damaged").iterdir()) == [
        "ckpt-000000001", "ckpt-000000002"]


def test_an_interrupted_write_leaves_no_visible_checkpoint(tmp_path):
    model, optimizer, checkpoint = make_state()
    manager = CheckpointManager(tmp_path / "checkpoints", checkpoint)
    manager.save(1)
    (tmp_path / "checkpoints" / ".ckpt-000000002.tmp-999").mkdir()  # a writer killed mid-save
    assert [c.step for c in manager.local_checkpoints()] == [1]
    manager.save(2)
    assert not list((tmp_path / "checkpoints").glob(".*tmp*"))


def test_incompatible_model_is_refused_naming_the_checkpoint(tmp_path):
    _, _, checkpoint = make_state(width=64)
    CheckpointManager(tmp_path / "checkpoints", checkpoint).save(1)
    _, _, other = make_state(width=32)
    with pytest.raises(CheckpointError, match="ckpt-000000001.*does not fit the model"):
        CheckpointManager(tmp_path / "checkpoints", other).restore_latest()


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if result.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)])


def test_a_full_destination_fails_clearly_and_keeps_earlier_checkpoints(small_disk):
    model, optimizer, checkpoint = make_state(width=256)  # about 0.8 MB of weights and Adam slots
    manager = CheckpointManager(small_disk / "checkpoints", checkpoint, safety_margin=0)
    manager.save(1)
    before = sorted(p.name for p in (small_disk / "checkpoints" / "ckpt-000000001").iterdir())
    (small_disk / "filler").write_bytes(b"\0" * (shutil_free(small_disk) - 200_000))
    train_a_step(model, optimizer)
    with pytest.raises(CheckpointError, match="Not enough space to save the checkpoint for step 2.*is free"):
        manager.save(2)
    assert [c.step for c in manager.local_checkpoints()] == [1]
    assert verify(manager.local_checkpoints()[0]) is None
    assert sorted(p.name for p in (small_disk / "checkpoints" / "ckpt-000000001").iterdir()) == before
    # The disk filling up during the write itself (estimate check disabled): a clear error, nothing partial left.
    manager.safety_margin = -(10**12)
    with pytest.raises(CheckpointError, match="filled up while saving the checkpoint for step 2"):
        manager.save(2)
    assert [p.name for p in (small_disk / "checkpoints").iterdir() if p.is_dir()] == ["ckpt-000000001"]
    assert verify(manager.local_checkpoints()[0]) is None


def shutil_free(path):
    import shutil

    return shutil.disk_usage(path).free
