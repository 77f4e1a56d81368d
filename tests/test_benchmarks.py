"""Every benchmark still runs: each ``benchmarks/bench_*.py --smoke`` in its own process, as a user would start it.

``--smoke`` is a seconds-long run of the benchmark's own code path (a tiny model, a few steps, tiny data); its
figures mean nothing, so nothing here checks their values, only that the script ran, said it was a smoke run and
printed figures. The scripts are found by glob: a new benchmark is covered as soon as it exists, and fails here
until it has ``--smoke``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted((ROOT / "benchmarks").glob("bench_*.py"))
TIMEOUT_SECONDS = 300  # per script; a smoke run takes seconds plus its framework imports
FIGURE = re.compile(r"\d\.\d|\d\s*%")  # a measured figure: a decimal number or a percentage


def test_benchmarks_are_found():
    names = {script.name for script in BENCHMARKS}
    assert {"bench_train.py", "bench_train_jax.py", "bench_storage.py"} <= names, names


def run_smoke(script: Path) -> tuple[int, str, str, float]:
    """(exit code, stdout, stderr, seconds) of ``script --smoke``; its whole process group is killed on timeout."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, str(script), "--smoke"], cwd=ROOT, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the benchmark and whatever it started (trainers, an emulator)
        stdout, stderr = process.communicate()
        pytest.fail(f"{script.name} --smoke ran past {TIMEOUT_SECONDS} s: a smoke run must take seconds (a tiny "
                    f"model, a few steps, tiny data). Its output so far:\n{stdout[-3000:]}\n{stderr[-3000:]}")
    return process.returncode, stdout, stderr, time.perf_counter() - start


@pytest.mark.slow
@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda path: path.stem)
def test_benchmark_smoke_run(script: Path):
    code, stdout, stderr, seconds = run_smoke(script)
    failed = f"{script.name} --smoke exited with {code} after {seconds:.0f} s"
    if "unrecognized arguments: --smoke" in stderr:
        pytest.fail(f"{script.name} has no --smoke flag: add one (a seconds-long run of the same code path on a tiny "
                    "model and data, saying that its figures are meaningless; benchmarks/support.py's parse_args "
                    "adds it) so that CI proves the benchmark still runs.")
    assert code == 0, f"{failed}:\n{stdout[-3000:]}\n{stderr[-5000:]}"
    assert re.search("smoke", stdout, re.IGNORECASE), (
        f"{script.name} --smoke must say in its output that it ran in smoke mode (its figures are meaningless):\n"
        f"{stdout[-3000:]}")
    figures = [line for line in stdout.splitlines() if FIGURE.search(line) and "smoke" not in line.lower()]
    assert figures, f"{script.name} --smoke printed no figure:\n{stdout[-3000:]}"
    print(f"{script.name} --smoke: {seconds:.1f} s")
