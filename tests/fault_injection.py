"""Training processes killed with SIGKILL inside steps and inside checkpoint writes, then restarted: the
helpers the exact-resume tests of both backends share (no TensorFlow imported here)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from tpu_pretrain.config import Config
from tpu_pretrain.data.create import create_pretraining_data
from tpu_pretrain.data.sample_corpus import write_sample_corpus
from tpu_pretrain.data.vocab import build_vocab

STEPS = 300
ENV = {**os.environ, "TF_DETERMINISTIC_OPS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
# XLA's unoptimised code: compiles in about half the time, and the tests run a few steps (tests/conftest.py)
QUICK_XLA = "--xla_backend_optimization_level=0"
JAX_CACHE_VARIABLES = ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                       "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES")


def with_quick_xla(xla_flags: str) -> str:
    """``xla_flags`` with XLA's quick level, once."""
    return xla_flags if QUICK_XLA in xla_flags else f"{xla_flags} {QUICK_XLA}".strip()


def quick_compiles(xla_flags: str = "") -> dict[str, str]:
    """ENV's compile settings alone (XLA's quick level after ``xla_flags``, the shared JAX cache: tests/conftest.py),
    for a process that takes none of ENV's other variables; none where an image's TPU compiler is under test."""
    if QUICK_XLA not in ENV.get("XLA_FLAGS", ""):
        return {}
    return {"XLA_FLAGS": with_quick_xla(xla_flags), **{k: ENV[k] for k in JAX_CACHE_VARIABLES if k in ENV}}


def sample_data(root: Path, max_chars: int = 80_000, num_shards: int = 3, workers: int = 0, vocab_size: int = 1500,
                **settings) -> str:
    """A small data folder from the sample corpus (its vocab in ``root``): ``num_shards`` training shards and an eval
    shard, length 64, the classic recipe's next-sentence pairs; ``settings`` of create-data override
    (``recipe="modern"``: packed MLM-only data, its own number of predictions)."""
    corpus = write_sample_corpus(root / "corpus.txt", max_chars=max_chars)
    vocab = build_vocab(Config.load(input=[str(corpus)], vocab_size=vocab_size, num_unused_tokens=5,
                                    output_dir=str(root)))
    values = dict(max_seq_length=64, dupe_factor=1, num_shards=num_shards, eval_fraction=0.05, workers=workers)
    settings.setdefault("recipe", "classic")  # next-sentence pairs, which the tests that use it check
    if settings["recipe"] == "classic":
        values["max_predictions_per_seq"] = 10
    create_pretraining_data(Config.load(input=[str(corpus)], vocab_file=vocab.path, output_dir=str(root / "data"),
                                        **{**values, **settings}))
    return str(root / "data")


def train_command(data_dir, run_dir, steps=STEPS, extra=()):
    return [sys.executable, "-m", "tpu_pretrain", "train", "--data_dir", data_dir, "--output_dir", str(run_dir),
            "--recipe", "classic", "--model_size", "L2-H128", "--train_batch_size", "8",
            "--num_train_steps", str(steps), "--num_warmup_steps", "4", "--learning_rate", "1e-3",
            "--save_checkpoints_steps", "4",
            "--log_every_steps", "4", "--eval_every_steps", "0", "--max_eval_steps", "1",
            "--steps_per_execution", "1", "--hidden_dropout_prob", "0.1", "--log_example_ids", "--train_seed", "3",
            "--shuffle_buffer_size", "64", "--keep_checkpoint_max", "3", "--session_hours", "-1", *extra]


def example_ids_by_step(run_dir):
    """Every logged (step -> ids), checking that a step replayed after a crash used the same examples."""
    seen = {}
    for line in (Path(run_dir) / "logs" / "example_ids.jsonl").read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:  # a line cut by SIGKILL
            continue
        if entry["step"] in seen:
            assert seen[entry["step"]] == entry["ids"], f"step {entry['step']} replayed with other examples"
        seen[entry["step"]] = entry["ids"]
    return seen


def kill_repeatedly(command: list[str], run: Path, kills_wanted: int = 6, seed: int = 20261122) -> dict:
    """Start ``command`` again and again, SIGKILLing it among steps or while a checkpoint is being written."""
    rng = random.Random(seed)
    kills = {"step": 0, "checkpoint write": 0}
    for attempt in range(2 * kills_wanted):
        if sum(kills.values()) >= kills_wanted:
            break
        mode = "checkpoint write" if attempt % 2 else "step"
        process = subprocess.Popen(command, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ids_log = run / "logs" / "example_ids.jsonl"
        start_size = ids_log.stat().st_size if ids_log.exists() else 0
        deadline = time.time() + 300
        killed = False
        while process.poll() is None and time.time() < deadline:
            if mode == "step" and ids_log.exists() and ids_log.stat().st_size > start_size:
                time.sleep(rng.uniform(0.0, 0.5))  # somewhere among the next steps
                killed = process.poll() is None
            elif mode == "checkpoint write" and list((run / "checkpoints").glob(".ckpt-*.tmp-*")):
                killed = process.poll() is None  # a checkpoint folder is being written right now
            if killed:
                process.send_signal(signal.SIGKILL)
                process.wait()
                kills[mode] += 1
                break
            time.sleep(0.002)
        if not killed:
            process.wait()
            break  # it finished before it could be killed
    print("kills:", kills)
    return kills


def check_resumed_run(data_dir, tmp_path, final_variables, extra=()) -> None:
    """The whole fault-injection check: an uninterrupted run, a run killed six times and finished, compared
    (with dropout on: its masks are a function of seed and step, like the data order)."""
    reference = tmp_path / "reference"
    done = subprocess.run(train_command(data_dir, reference, extra=extra), env=ENV, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "interrupted"
    kills = kill_repeatedly(train_command(data_dir, run, extra=extra), run)
    assert kills["step"] >= 3 and kills["checkpoint write"] >= 2, kills
    assert not (run / "checkpoints" / f"ckpt-{STEPS:09d}").exists()
    final = subprocess.run(train_command(data_dir, run, extra=extra), env=ENV, capture_output=True, text=True,
                           timeout=600)
    assert final.returncode == 0, final.stderr[-3000:]

    expected, got = final_variables(reference), final_variables(run)
    assert expected.keys() == got.keys() and len(expected) > 10
    worst = max(float(abs(got[n] - expected[n]).max()) for n in expected)
    print(f"max abs weight difference after {sum(kills.values())} SIGKILLs: {worst:.3g}")
    for name in expected:
        assert float(abs(got[name] - expected[name]).max()) <= 1e-6, name
    reference_ids, resumed_ids = example_ids_by_step(reference), example_ids_by_step(run)
    assert sorted(resumed_ids) == list(range(1, STEPS + 1))
    assert resumed_ids == reference_ids  # the same examples at every step: none repeated, none skipped
