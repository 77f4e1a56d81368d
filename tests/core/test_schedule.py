"""The warmup-stable-decay schedule across sessions on the TensorFlow backend (the schedule itself:
tests/core/test_schedules.py): a run trained in its stable phase resumes with a cool-down
chosen then, and the learning rate neither jumps nor differs from an uninterrupted run's at any step."""

import json
import os
import signal
import threading
import time

import numpy as np
import pytest

import tpu_pretrain  # noqa: F401  (Keras 2 before TensorFlow)

from pretraining_fixtures import synthetic_instances, write_shards, write_vocab  # isort: skip

from tpu_pretrain.config import Config
from tpu_pretrain.training import train

PEAK = 1e-3


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("data"))
    write_shards(folder, {"train": synthetic_instances(128, 32, 5, 200),
                          "eval": synthetic_instances(16, 32, 5, 200, seed=1)}, 32, 5, 200)
    write_vocab(os.path.join(folder, "vocab.txt"), 200)
    return folder


def settings(data_dir, run, **extra):
    return Config.load(data_dir=data_dir, output_dir=str(run), model_size="L2-H128", train_batch_size=8,
                       learning_rate=PEAK, num_warmup_steps=4, lr_schedule="wsd", save_checkpoints_steps=2,
                       log_every_steps=1, eval_every_steps=0, max_eval_steps=1, steps_per_execution=1,
                       hidden_dropout_prob=0.0, session_hours=-1, **extra)


def rates(*results) -> dict[int, float]:
    return {entry["step"]: entry["learning_rate"] for result in results for entry in result.history}


def test_a_cool_down_started_on_resume_matches_an_uninterrupted_run(data_dir, tmp_path):
    run = tmp_path / "sessions"

    def stop_after_a_few_checkpoints():  # the session ends (SIGTERM) while the run is in its stable phase
        deadline = time.time() + 300
        while time.time() < deadline and not any(int(c.name[5:]) >= 8 for c in (run / "checkpoints").glob("ckpt-*")
                                                 if c.name[5:].isdigit()):  # any from step 8: older ones are pruned
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_after_a_few_checkpoints, daemon=True).start()
    first = train(settings(data_dir, run, num_train_steps=10_000), progress=False)  # no end in sight
    stopped = first.steps
    assert first.stopped_reason and 8 <= stopped < 8000  # in the stable phase (a busy machine stops it later)
    saved = json.loads((run / "checkpoints" / f"ckpt-{stopped:09d}" / "checkpoint.json").read_text())
    assert saved["metadata"]["lr_schedule"]["decay_start"] == 8000  # the plan then: 20% of 10,000 steps
    # The user decides to stop soon: 10 more steps, cooling down over the last 14 (whose start has passed).
    end = stopped + 10
    second = train(settings(data_dir, run, num_train_steps=end, num_cooldown_steps=14), progress=False)
    assert second.steps == end
    reference = train(settings(data_dir, tmp_path / "reference", num_train_steps=end, num_cooldown_steps=10),
                      progress=False)
    resumed, uninterrupted = rates(first, second), rates(reference)
    assert sorted(resumed) == list(range(1, end + 1)) == sorted(uninterrupted)
    np.testing.assert_allclose([resumed[s] for s in range(1, end + 1)],
                               [uninterrupted[s] for s in range(1, end + 1)], rtol=1e-6, atol=0)
    steps = np.diff([resumed[s] for s in range(stopped, end + 1)])
    assert np.all(steps <= 0) and np.max(np.abs(steps)) <= PEAK / 10 * 1.0001  # no jump: one tenth per step
    # (the logged rate is the one each step used: the last step's is one tenth of the peak)
    assert resumed[stopped] == pytest.approx(PEAK, rel=1e-6) and resumed[end] == pytest.approx(PEAK / 10, rel=1e-5)
