"""Resuming with other step counts on both backends: a real run stopped (SIGTERM) mid-decay and resumed with a
longer ``num_train_steps`` continues from the learning rate it reached, says so, and ends where the new plan
says; a finished run extended asks for ``--rewarm_steps`` and then warms up again."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from fault_injection import ENV
from pretraining_fixtures import synthetic_instances, write_shards, write_vocab

from tpu_pretrain.export.plots import read_scalars

pytest.importorskip("jax")
PEAK, FIRST_PLAN, SECOND_PLAN = 1e-3, 200, 40


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("data"))
    write_shards(folder, {"train": synthetic_instances(64, 32, 5, 200)}, 32, 5, 200)
    write_vocab(os.path.join(folder, "vocab.txt"), 200)
    return folder


def command(data_dir, run, backend, steps, *extra):
    return [sys.executable, "-m", "tpu_pretrain", "train", "--backend", backend, "--data_dir", data_dir,
            "--output_dir", str(run), "--model_size", "L2-H128", "--train_batch_size", "8", "--num_train_steps",
            str(steps), "--num_warmup_steps", "2", "--learning_rate", str(PEAK), "--save_checkpoints_steps", "2",
            "--log_every_steps", "1", "--eval_every_steps", "0", "--steps_per_execution", "1",
            "--hidden_dropout_prob", "0", "--session_hours", "-1", "--accelerator", "cpu", "--recipe", "classic",
            *extra]


def stopped_after(step: int, args: list[str], run) -> subprocess.CompletedProcess:
    """Start training and send SIGTERM once the checkpoint of ``step`` exists: it saves and exits 75."""
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    deadline = time.time() + 300
    while process.poll() is None and time.time() < deadline:
        if (run / "checkpoints" / f"ckpt-{step:09d}").is_dir():
            process.send_signal(signal.SIGTERM)
            break
        time.sleep(0.05)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 75, output[-3000:]
    return output


def logged_rates(run) -> dict[int, float]:
    return dict(read_scalars(run)["train"]["learning_rate"])


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_more_steps_on_resume_decay_on_from_the_rate_reached(data_dir, tmp_path, backend):
    run = tmp_path / "run"
    stopped_after(6, command(data_dir, run, backend, FIRST_PLAN), run)
    first = logged_rates(run)
    stop = max(first)
    assert 6 <= stop < FIRST_PLAN
    # the first plan's BERT line: the last update before the stop used rate(stop - 1)
    assert first[stop] == pytest.approx(PEAK * (1 - (stop - 1) / FIRST_PLAN), rel=1e-5)
    # shorter than planned now: the rate decays on from where it is to 0 at step SECOND_PLAN
    done = subprocess.run(command(data_dir, run, backend, SECOND_PLAN), capture_output=True, text=True, timeout=600,
                          env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    log = done.stdout + done.stderr
    assert f"re-planned at step {stop}" in log and f"num_train_steps {FIRST_PLAN} -> {SECOND_PLAN}" in log
    rates = logged_rates(run)
    reached = PEAK * (1 - stop / FIRST_PLAN)  # the rate of the update at step `stop`, the first after resuming
    assert rates[stop + 1] == pytest.approx(reached, rel=1e-5)  # continuous: no jump
    remaining = SECOND_PLAN - stop
    expected = [reached * (1 - (s - 1 - stop) / remaining) for s in range(stop + 1, SECOND_PLAN + 1)]
    np.testing.assert_allclose([rates[s] for s in range(stop + 1, SECOND_PLAN + 1)], expected, rtol=1e-5)
    assert rates[SECOND_PLAN] == pytest.approx(reached / remaining, rel=1e-5)  # the last update, before 0
    if backend == "tensorflow":
        # extended as wsd with the cool-down over the whole extension (issue 24, item 8; wsd: this backend's): the
        # rate would stay 0, so it is refused, saying so and what to add
        wsd = command(data_dir, run, backend, SECOND_PLAN + 30, "--lr_schedule", "wsd", "--num_cooldown_steps",
                      str(SECOND_PLAN + 30))
        refused = subprocess.run(wsd, capture_output=True, text=True, timeout=600, env=ENV)
        assert refused.returncode == 2, refused.stderr[-3000:]
        assert "going on would train at about zero. Add --rewarm_steps" in " ".join(refused.stderr.split())
        return  # the rest is the core's alone (tests/core/test_schedules.py); once, on the cheaper backend, suffices

    # The run is finished (rate 0). Extending it is refused, saying why and what to add ...
    longer = command(data_dir, run, backend, SECOND_PLAN + 6)
    refused = subprocess.run(longer, capture_output=True, text=True, timeout=600, env=ENV)
    assert refused.returncode != 0 and "--rewarm_steps" in refused.stderr, refused.stderr[-2000:]
    # ... and with it, a new phase warms up from 0 to the peak and decays again to the new end.
    again = subprocess.run(longer + ["--rewarm_steps", "2"], capture_output=True, text=True, timeout=600,
                           env=ENV)
    assert again.returncode == 0, again.stderr[-3000:]
    rates = logged_rates(run)
    np.testing.assert_allclose([rates[s] for s in range(SECOND_PLAN + 1, SECOND_PLAN + 7)],
                               [0.0, PEAK / 2, PEAK, PEAK * 3 / 4, PEAK / 2, PEAK / 4], rtol=1e-5, atol=1e-12)
