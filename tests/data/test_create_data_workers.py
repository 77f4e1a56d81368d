"""create-data's worker processes when the machine is hostile (issue 37): a worker killed mid-shard as the
out-of-memory killer does, no writable folder for the compiled code's cache (a read-only package folder and HOME,
mounted so in a mount namespace of the command's own), a damaged cache file; and two create-data runs at once."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import tpu_pretrain
from tpu_pretrain.config import Config
from tpu_pretrain.data.sample_corpus import write_sample_corpus
from tpu_pretrain.data.shard_pool import ShardPool, WorkerDied
from tpu_pretrain.data.vocab import build_vocab

PACKAGE = Path(tpu_pretrain.__file__).parent


@pytest.fixture(scope="module")
def corpus_and_vocab(tmp_path_factory):
    root = tmp_path_factory.mktemp("workers")
    corpus = write_sample_corpus(root / "corpus.txt", max_chars=150_000)
    vocab = build_vocab(Config.load(input=[str(corpus)], vocab_size=1500, num_unused_tokens=5, output_dir=str(root)))
    big = root / "big.txt"
    big.write_text(corpus.read_text() * 4)
    return corpus, big, vocab.path


def create_data(*args, env=None, **popen):
    command = [sys.executable, "-m", "tpu_pretrain", "create-data", *map(str, args)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})}, start_new_session=True, **popen)


def finish(process, timeout: float = 120) -> tuple[int, str]:
    """The exit code and stderr of a create-data process; one that is still running after ``timeout`` (a hang)
    is killed with its workers, and fails the test."""
    try:
        _, err = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return process.returncode, err


def writer_of_a_shard(process) -> psutil.Process | None:
    """The worker process of ``process`` that has a shard open for writing, if any."""
    for child in psutil.Process(process.pid).children():
        try:
            if any(f.path.endswith(".tfrecord.tmp") for f in child.open_files()):
                return child
        except psutil.NoSuchProcess:
            continue
    return None


def killed_at_once(task):
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_worker_killed_the_moment_it_takes_a_task_is_named_with_that_task():
    """The task a worker holds is known without a message from it: a queue's message is sent by a thread of the
    worker, which a SIGKILL ends with whatever it had not sent (the command said "between shards", once in CI)."""
    for _ in range(3):
        with ShardPool(1, os.getpid) as pool, pytest.raises(WorkerDied) as died:
            list(pool.imap_unordered(killed_at_once, ["train-00002-of-00004.tfrecord"]))
        assert died.value.task == "train-00002-of-00004.tfrecord" and died.value.exitcode == -signal.SIGKILL


def test_a_worker_killed_mid_shard_stops_the_command_naming_the_shard_and_the_rest_is_written_again(
        corpus_and_vocab, tmp_path):
    _, big, vocab = corpus_and_vocab
    out = tmp_path / "data"
    args = ("--input", big, "--vocab_file", vocab, "--output_dir", out, "--num_shards", "4", "--dupe_factor", "5",
            "--workers", "2", "--max_seq_length", "64", "--max_predictions_per_seq", "10")
    process = create_data(*args)
    deadline = time.time() + 120
    while time.time() < deadline and (victim := writer_of_a_shard(process)) is None:
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)  # what the kernel's out-of-memory killer does
    code, err = finish(process, timeout=15)  # within seconds, not never
    assert code == 1, err[-3000:]
    said = " ".join(err.split())
    assert "A worker process was killed by SIGKILL while writing " in said and "-of-00004.tfrecord" in said, said
    assert "out-of-memory killer" in said and "fewer --workers (now 2)" in said and "Traceback" not in err
    assert "run the same command again" in said and not list(out.glob("*.tmp"))
    code, err = finish(create_data(*args))
    assert code == 0, err[-3000:]
    assert (out / "manifest.json").is_file() and len(list(out.glob("*.tfrecord"))) == 5


def in_namespace(script: str, env: dict) -> subprocess.CompletedProcess:
    """``script`` in a mount namespace of its own (root: read-only bind mounts that only it sees); ``env`` over this
    process's environment (None: unset)."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare here")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode:
        pytest.skip(f"cannot make a mount namespace here: {probe.stderr.decode().strip()}")
    environment = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    return subprocess.run(["unshare", "-m", "sh", "-ec", script], capture_output=True, text=True, timeout=300,
                          env=environment)


def seeded_cache(cache: Path) -> Path:
    """A numba cache folder (``NUMBA_CACHE_DIR``) holding this checkout's compiled code, when it is compiled
    already (the suite's other create-data runs do that), so that the test pays no compilation."""
    from numba.core.caching import _CacheLocator

    folder = cache / _CacheLocator.get_suitable_cache_subpath(str(PACKAGE / "data" / "example_encoder.py"))
    folder.mkdir(parents=True)
    for file in (PACKAGE / "data" / "__pycache__").glob("*.nb[ic]"):
        shutil.copy2(file, folder / file.name)
    return folder


def test_without_a_writable_cache_folder_the_compiled_code_is_cached_in_a_temporary_one(corpus_and_vocab, tmp_path):
    corpus, _, vocab = corpus_and_vocab
    home, temp = tmp_path / "home", tmp_path / "temp"
    home.mkdir()
    seeded_cache(temp / f"tpu_pretrain-numba-cache-{os.getuid()}")
    out = tmp_path / "data"
    script = (f"mount --bind -o ro {PACKAGE} {PACKAGE}; mount --bind -o ro {home} {home}; "
              f"exec {sys.executable} -m tpu_pretrain create-data --input {corpus} --vocab_file {vocab} "
              f"--output_dir {out} --num_shards 2 --workers 2 --dupe_factor 1")
    env = {"HOME": str(home), "TMPDIR": str(temp), "XDG_CACHE_HOME": None, "NUMBA_CACHE_DIR": None,
           "PYTHONPATH": str(PACKAGE.parent)}
    done = in_namespace(script, env)
    assert done.returncode == 0, done.stderr[-3000:]
    said = " ".join(done.stderr.split())
    assert (f"No writable folder for the compiled code's cache beside {PACKAGE / 'data'} or in HOME: caching it in "
            f"{temp}") in said and "Set NUMBA_CACHE_DIR to a writable folder" in said
    assert "no locator available" not in said and (out / "manifest.json").is_file()


def test_a_damaged_cache_file_is_rebuilt_saying_so(corpus_and_vocab, tmp_path):
    corpus, _, vocab = corpus_and_vocab
    cache = tmp_path / "cache"
    folder = seeded_cache(cache)
    args = ("--input", corpus, "--vocab_file", vocab, "--num_shards", "2", "--workers", "2", "--dupe_factor", "1")
    first = create_data(*args, "--output_dir", tmp_path / "first", env={"NUMBA_CACHE_DIR": str(cache)})
    assert finish(first, timeout=300)[0] == 0  # every function cached there (compiled if it was not)
    for gather in folder.glob("example_encoder._gather-*.nbc"):  # a function the workers load first thing
        with open(gather, "r+b") as handle:
            handle.truncate(gather.stat().st_size // 2)
    code, err = finish(create_data(*args, "--output_dir", tmp_path / "second", env={"NUMBA_CACHE_DIR": str(cache)}))
    assert code == 0, err[-3000:]
    assert "The compiled code's cache of _gather in" in err and "is damaged" in err and "it is rebuilt" in err
    assert "Traceback" not in err
    again = create_data(*args, "--output_dir", tmp_path / "third", env={"NUMBA_CACHE_DIR": str(cache)})
    assert "damaged" not in finish(again)[1]  # rebuilt for good
