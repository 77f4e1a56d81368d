"""The JAX trainer's input read ahead by a background thread (:mod:`tpu_pretrain.jax_backend.prefetch`): the
same steps as without it, bit for bit, exact restarts, errors raised in the caller, no thread left behind, and
the time the devices waited on input reported by the steps and by the run.

Real trainer (L2-H128) on small shards written without TensorFlow. They run in the environment without TensorFlow
(``make test-jax-stack``): where TensorFlow is installed, bert4keras takes the name ``keras`` for tf-keras in the
suite's process, and the same tests would only repeat there in a fresh process.
"""

import importlib.util
import json
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")

if importlib.util.find_spec("tensorflow") is not None or importlib.util.find_spec("bert4keras") is not None:
    pytest.skip("for the environment without TensorFlow (make test-jax-stack)", allow_module_level=True)

from pretraining_fixtures import synthetic_instances, write_vocab  # noqa: E402

from tpu_pretrain.config import Config  # noqa: E402
from tpu_pretrain.data.data_folder import Manifest, ShardStats  # noqa: E402
from tpu_pretrain.data.tfrecord import AtomicRecordWriter  # noqa: E402

T, P, V, B = 32, 5, 300, 8


def write_data(folder: Path, train: int = 96, shards: int = 2) -> str:
    """A data folder of toy instances (train shards, manifest.json, vocab.txt; no eval), without TensorFlow."""
    folder.mkdir(parents=True, exist_ok=True)
    manifest = Manifest(settings={"max_seq_length": T, "max_predictions_per_seq": P}, vocab_size=V, vocab_sha256="",
                        inputs=[], corpus_report="written by a test")
    instances = synthetic_instances(train, T, P, V)
    for shard in range(shards):
        part = instances[shard::shards]
        name = f"train-{shard:05d}-of-{shards:05d}.tfrecord"
        arrays = {k: np.asarray([inst[k] for inst in part]) for k in part[0]}
        arrays["masked_lm_weights"] = arrays["masked_lm_weights"].astype(np.float32)
        writer = AtomicRecordWriter(folder / name)
        writer.write_examples(arrays)
        writer.close()
        manifest.shards.append(ShardStats(file=name, split="train", instances=len(part)))
    (folder / "manifest.json").write_text(json.dumps(manifest.to_json()))
    write_vocab(str(folder / "vocab.txt"), V)
    return str(folder)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_data(tmp_path_factory.mktemp("overlap"))


def settings(data_dir, output_dir, **overrides) -> dict:
    values = dict(data_dir=data_dir, output_dir=str(output_dir), model_size="L2-H128", backend="jax",
                  train_batch_size=B, num_train_steps=8, num_warmup_steps=2, learning_rate=1e-3,
                  steps_per_execution=2, accelerator="cpu", mixed_precision="float32", log_example_ids=True,
                  train_seed=7, log_every_steps=4, save_checkpoints_steps=4, eval_every_steps=0, max_eval_steps=1,
                  session_hours=-1)
    return {**values, **overrides}


@pytest.fixture(scope="module")
def built(data_dir, tmp_path_factory):
    """One trainer for the module (building and compiling dominate these tests) and its initial state."""
    from tpu_pretrain.jax_backend.trainer import JaxTrainer

    made = JaxTrainer(Config.load(**settings(data_dir, tmp_path_factory.mktemp("run"))))
    yield made, made.checkpoint_state().get()
    made.close()


@pytest.fixture
def trainer(built):
    """The module's trainer at step 0, reading ahead as it does by default."""
    made, start = built
    made.close()
    made.checkpoint_state().put(start)
    made.prefetch_chunks = default_depth()
    made.example_ids.clear()
    return made


def default_depth() -> int:
    from tpu_pretrain.jax_backend.trainer import JaxTrainer

    return JaxTrainer.prefetch_chunks


def prefetch_threads() -> list[str]:
    from tpu_pretrain.jax_backend.prefetch import THREAD_NAME

    return [t.name for t in threading.enumerate() if t.name == THREAD_NAME or t.name.startswith("input_")]


def expected_ids(trainer, start_step: int, steps: int) -> list[list[int]]:
    """The ids the input gives from ``start_step`` on, read directly (no prefetcher, no trainer)."""
    from tpu_pretrain.jax_backend.input import TrainingBatches

    batches = TrainingBatches(trainer.data.train_files, B, T, P, seed=7, start_record=start_step * B)
    ids = [next(batches)[0].tolist() for _ in range(steps)]
    batches.close()
    return ids


def reference_weights(trainer, chunks: list[int]) -> dict:
    """The weights after ``chunks`` calls of the compiled steps on batches stacked and placed by hand on the host,
    one call after the other (what ``train_steps`` did before it read ahead)."""
    import jax

    from tpu_pretrain.jax_backend.input import BATCH_FEATURES, TrainingBatches

    batches = TrainingBatches(trainer.data.train_files, B, T, P, seed=7)
    for n in chunks:
        pulled = [next(batches)[1] for _ in range(n)]
        stacked = jax.device_put({k: np.stack([b[k] for b in pulled]) for k in BATCH_FEATURES},
                                 trainer.devices.split(axis=1))
        trainer.state, sums = trainer._train_chunk(trainer.state, stacked, np.int32(n))
        jax.device_get(sums)
    batches.close()
    return trainer.stored_weights()


def test_read_ahead_gives_the_serial_steps_bit_for_bit(trainer):
    """Calls of 3, 1 and 4 steps (calls of 2 and single steps) with the input read ahead, and with it off."""
    state = trainer.checkpoint_state()
    start = state.get()
    runs = {}
    for depth in (0, 2):
        state.put(start)
        trainer.prefetch_chunks = depth
        trainer.start_input(0)
        trainer.example_ids.clear()
        metrics = [trainer.train_steps(n) for n in (3, 1, 4)]
        runs[depth] = ([m["loss"] for m in metrics], trainer.stored_weights(), list(trainer.example_ids), metrics)
    (serial_losses, serial_weights, serial_ids, serial), (losses, weights, ids, metrics) = runs[0], runs[2]
    assert losses == serial_losses and all(np.isfinite(losses))
    state.put(start)
    reference = reference_weights(trainer, [2, 1, 1, 2, 2])
    for name in serial_weights:
        np.testing.assert_array_equal(weights[name], serial_weights[name], err_msg=name)
        np.testing.assert_array_equal(weights[name], reference[name], err_msg=name)
    assert ids == serial_ids == list(zip(range(1, 9), expected_ids(trainer, 0, 8), strict=True))
    for m in serial + metrics:
        assert m["input_wait_seconds"] >= 0 and 0 <= m["input_wait_share"] <= 1
    assert all(m["input_wait_seconds"] > 0 for m in serial)  # serial: every call waits for its input


def test_start_input_drops_what_was_read_ahead_and_restarts_at_the_exact_step(trainer):
    trainer.start_input(0)
    trainer.train_steps(2)
    first = trainer._prefetch
    for _ in range(3000):  # until the thread has read ahead as far as it may
        if first.queued == first.depth:
            break
        threading.Event().wait(0.01)
    assert first.queued == first.depth and first.running
    trainer.example_ids.clear()
    trainer.start_input(5)
    assert not first.running and first.queued == 0
    trainer.train_steps(3)
    assert [ids for _, ids in trainer.example_ids] == expected_ids(trainer, 5, 3)


def test_close_leaves_no_thread_running_and_the_next_steps_reopen_the_input(trainer):
    trainer.start_input(trainer.step)
    trainer.train_steps(1)
    assert prefetch_threads()
    trainer.close()
    assert prefetch_threads() == []
    step = trainer.step
    trainer.example_ids.clear()
    trainer.train_steps(1)  # opened again at the trainer's step
    assert [ids for _, ids in trainer.example_ids] == expected_ids(trainer, step, 1)
    trainer.close()
    assert prefetch_threads() == []


def test_a_corrupt_shard_read_ahead_raises_its_error_in_the_caller(trainer, tmp_path):
    from tpu_pretrain.jax_backend.input import TrainingBatches

    broken = Path(write_data(tmp_path / "data", train=32, shards=1))
    shard = broken / "train-00000-of-00001.tfrecord"
    raw = bytearray(shard.read_bytes())
    raw[20] ^= 0xFF  # inside the first record's payload: its CRC no longer matches
    shard.write_bytes(bytes(raw))
    trainer.train_batches = TrainingBatches([str(shard)], B, T, P, seed=7)  # read by the trainer's prefetch thread
    for _ in range(2):  # and again: the error stays, the caller never hangs
        with pytest.raises(ValueError, match=r"train-00000-of-00001.tfrecord: record 0 is corrupt \(CRC mismatch\)"):
            trainer.train_steps(4)  # the epoch's 32 records: record 0 among them
    trainer.close()
    assert prefetch_threads() == []


def test_the_prefetcher_hands_over_the_input_error_and_its_end():
    from tpu_pretrain.jax_backend.prefetch import BatchPrefetcher

    def source():
        yield np.arange(2), {"x": 1}
        raise OSError("disk gone")

    prefetcher = BatchPrefetcher(source(), lambda b: b, depth=2)
    assert prefetcher.take(1)[0][1] == {"x": 1}
    with pytest.raises(OSError, match="disk gone"):
        prefetcher.take(1)
    prefetcher.close()
    ended = BatchPrefetcher(iter([(np.arange(2), {})]), lambda b: b, depth=2)
    with pytest.raises(StopIteration):
        ended.take(2)
    ended.close()
    assert prefetch_threads() == []


def test_the_run_reports_the_input_wait_share(trainer, caplog):
    from tpu_pretrain.core.loop import run_training

    output = Path(trainer.config.storage.output_dir)
    with caplog.at_level("INFO", logger="tpu_pretrain.core"):
        result = run_training(trainer, str(output), progress=False)
    assert result.steps == 8 and 0 <= result.input_wait_share <= 1 and "input wait" in result.summary()
    assert all(0 <= h["input_wait_share"] <= 1 for h in result.history)
    assert json.loads((output / "train_summary.json").read_text())["input_wait_share"] == result.input_wait_share
    assert any(r.getMessage().startswith("step 8/8") and "input wait" in r.getMessage() for r in caplog.records)
    assert prefetch_threads() == []


