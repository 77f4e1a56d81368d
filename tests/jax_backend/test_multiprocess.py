"""The JAX backend on several processes through the real command line (JAX's own runtime, gloo collectives, a
loopback coordinator): four CPU processes train as one, each reading its rows of the global batch, and give the
loss curve and the final weights of one process training the same global batch alone; the run continues on two
processes with the examples the uninterrupted run would have read, and the steps one process takes. One process
killed with SIGKILL stops the other, which names it; the same command resumes exactly."""

from __future__ import annotations

import glob
import importlib.util
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from fault_injection import ENV, QUICK_XLA, sample_data

if importlib.util.find_spec("tensorflow") is not None:  # the JAX backend's own tests run once, where JAX runs
    pytest.skip("for the environment without TensorFlow (make test-jax-stack)", allow_module_level=True)

from tpu_pretrain.export.plots import read_scalars
from tpu_pretrain.jax_backend.input import TrainingBatches
from tpu_pretrain.models.run_weights import read_arrays

STEPS = 4


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return sample_data(tmp_path_factory.mktemp("multiprocess"), max_chars=30_000, num_shards=2, workers=1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(data_dir: str, run: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tpu_pretrain", "train", "--backend", "jax", "--data_dir", data_dir,
            "--output_dir", str(run), "--recipe", "classic", "--model_size", "L2-H128", "--train_batch_size", "8",
            "--num_train_steps", str(STEPS), "--num_warmup_steps", "1", "--learning_rate", "1e-3",
            "--hidden_dropout_prob", "0.1", "--save_checkpoints_steps", "2", "--log_every_steps", "1",
            "--eval_every_steps", "0", "--max_eval_steps", "1", "--steps_per_execution", "1", "--log_example_ids",
            "--session_hours", "-1", *extra]


def environment(devices: int) -> dict:
    """``devices`` CPU devices; XLA's unoptimised code (level 0), which compiles in about half the CPU time: these
    runs take a few steps, and every process of a launch compiles its program."""
    return {**ENV, "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices} {QUICK_XLA}"}


def start(data_dir: str, run: Path, processes: int, devices: int, *extra: str) -> list:
    """Start training with ``processes`` processes of ``devices`` CPU devices each (loopback coordinator)."""
    port, started = free_port(), []
    for index in range(processes):
        several = ["--coordinator_address", f"127.0.0.1:{port}", "--num_processes", str(processes),
                   "--process_index", str(index)] if processes > 1 else []
        log = open(f"{run}.{index}.log", "w+")  # noqa: SIM115 - read back when the process has ended
        started.append((subprocess.Popen(command(data_dir, run, *several, *extra), stdout=log,
                                         stderr=subprocess.STDOUT, env=environment(devices)), log))
    return started


def finish(started: list) -> list[str]:
    """What each process printed, once all have ended (each must have succeeded)."""
    outputs = []
    for process, log in started:
        try:
            process.wait(timeout=600)
        finally:
            process.kill()
        log.seek(0)
        outputs.append(log.read())
        log.close()
        assert process.returncode == 0, outputs[-1][-3000:]
    return outputs


def expected_ids(data_dir: str, steps: int) -> list[str]:
    """example_ids.jsonl's lines as the global order defines them: a pure function of seed and position."""
    batches = TrainingBatches(sorted(glob.glob(f"{data_dir}/train-*.tfrecord")), 8, 64, 10, seed=0)
    try:
        return [json.dumps({"step": step + 1, "ids": batches.batch(step)[0].tolist()}) for step in range(steps)]
    finally:
        batches.close()


def compare_runs(runs: list[Path], steps: list[int]) -> None:
    """Equal losses at ``steps`` and equal final weights (within float tolerance: the sums over the global batch
    are reduced in another order)."""
    curves = [{s: v for s, v in read_scalars(run)["train"]["loss"]} for run in runs]
    np.testing.assert_allclose([curves[1][s] for s in steps], [curves[0][s] for s in steps], rtol=1e-5)
    final = [read_arrays(run / "checkpoints" / f"ckpt-{steps[-1]:09d}") for run in runs]
    assert final[0].keys() == final[1].keys()
    for name, value in final[0].items():
        np.testing.assert_allclose(final[1][name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_four_processes_train_as_one_and_a_resume_on_two_continues_the_same_example_order(data, tmp_path):
    alone, together = tmp_path / "alone", tmp_path / "together"
    runs = start(data, alone, processes=1, devices=4), start(data, together, processes=4, devices=1)
    finish(runs[0])
    chief, *followers = finish(runs[1])
    assert "CPU: 4 device(s) over 4 processes" in chief and all("follows process 0" in f for f in followers)
    # One writer: the chief's scalars alone (an event file is named by the process that writes it).
    assert len(list((together / "logs" / "train").glob("events.out.tfevents.*"))) == 1
    assert [s for s, _ in read_scalars(together)["train"]["loss"]] == list(range(1, STEPS + 1))
    compare_runs([alone, together], list(range(1, STEPS + 1)))
    assert sorted(p.name for p in (together / "checkpoints").glob("ckpt-*")) == ["ckpt-000000002", "ckpt-000000004"]

    # The four-process run continued on two: the examples the uninterrupted run would have read, in order, and the
    # steps a one-process run continued from the same checkpoint takes.
    more = ("--num_train_steps", str(STEPS + 2), "--rewarm_steps", "1")
    resumed = start(data, together, 2, 1, *more), start(data, alone, 1, 2, *more)
    finish(resumed[1])
    chief = finish(resumed[0])[0]
    assert f"Resuming from {together / 'checkpoints' / f'ckpt-{STEPS:09d}'}: step {STEPS}" in chief
    assert "CPU: 2 device(s) over 2 processes" in chief
    logged = (together / "logs" / "example_ids.jsonl").read_text().splitlines()
    assert logged == expected_ids(data, STEPS + 2)
    compare_runs([alone, together], [STEPS + 1, STEPS + 2])


def test_a_killed_process_stops_the_other_naming_it_and_the_same_command_resumes_exactly(data, tmp_path):
    killed, uninterrupted, steps = tmp_path / "killed", tmp_path / "uninterrupted", 12
    more = ("--num_train_steps", str(steps))
    reference = start(data, uninterrupted, 1, 2, *more)
    processes = start(data, killed, 2, 1, *more)
    deadline = time.monotonic() + 600
    while not (killed / "checkpoints" / "ckpt-000000004").is_dir() and time.monotonic() < deadline:
        time.sleep(0.05)
    processes[1][0].send_signal(signal.SIGKILL)
    lost_at = time.monotonic()
    survivor, log = processes[0]
    survivor.wait(timeout=300)
    stopped_within = time.monotonic() - lost_at
    log.seek(0)
    said = log.read()
    log.close()
    step = max(int(line.split()[1].split("/")[0]) for line in said.splitlines() if line.startswith("step "))
    assert survivor.returncode == 1, said[-3000:]
    assert stopped_within < 60, stopped_within  # the roll call's 10 s, not JAX's shutdown barrier
    assert f"Process 0 of 2 stopped after step {step}: process 1 (host {socket.gethostname()}) did not answer " \
        "within 10 s: stopped (killed, preempted or its host lost)" in said
    assert "Run the same command on every host to resume" in said and "Traceback" not in said
    assert not (killed / "train.lock").exists()

    resumed = finish(start(data, killed, 2, 1, *more))[0]
    assert "Resuming from " in resumed
    finish(reference)
    logged = [json.loads(line) for line in (killed / "logs" / "example_ids.jsonl").read_text().splitlines()]
    assert {e["step"]: e["ids"] for e in logged} == {
        e["step"]: e["ids"] for e in map(json.loads, expected_ids(data, steps))}
    compare_runs([uninterrupted, killed], [steps])


def test_several_processes_are_the_jax_backends_and_need_all_three_settings(data, tmp_path):
    def refused(*extra):
        done = subprocess.run(command(data, tmp_path / "refused", *extra), capture_output=True, text=True,
                              env=environment(1), timeout=300)
        assert done.returncode != 0
        return done.stderr

    assert "--coordinator_address HOST:PORT, --num_processes N" in refused("--num_processes", "2")
    assert "process_index=2 is invalid" in refused("--coordinator_address", "127.0.0.1:1", "--num_processes", "2",
                                                   "--process_index", "2")
    tensorflow = refused("--backend", "tensorflow", "--coordinator_address", "127.0.0.1:1", "--num_processes", "2")
    assert "offered by the jax backend, not tensorflow" in tensorflow


def test_a_follower_given_another_output_dir_says_the_chief_wrote_the_run(data, tmp_path):
    chief_run, follower_run, port = tmp_path / "chief", tmp_path / "follower", free_port()
    started = []  # what each says, not what they learn: no dropout, whose random masks slow the compile
    for index, run in enumerate([chief_run, follower_run]):
        log = open(f"{run}.log", "w+")  # noqa: SIM115 - read back by finish
        started.append((subprocess.Popen(command(data, run, "--coordinator_address", f"127.0.0.1:{port}",
                                                 "--num_processes", "2", "--process_index", str(index),
                                                 "--num_train_steps", "2", "--hidden_dropout_prob", "0"),
                                         stdout=log, stderr=subprocess.STDOUT, env=environment(1)), log))
    chief, follower = finish(started)
    assert f"Trained to step 2 in {chief_run}" in chief
    assert str(follower_run) not in follower.splitlines()[-1]
    assert "Trained to step 2 as a follower: process 0 wrote the run folder (its --output_dir)" in follower
    assert not any(follower_run.glob("checkpoints/*"))
