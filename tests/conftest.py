"""Shared fixtures: for the tests that talk to Cloud Storage, a real API server on loopback and a bucket; for the
tests of read-only and full disks, small real file systems; for the processes the tests start, one JAX compilation
cache."""

import atexit
import errno
import os
import shutil
import subprocess
import tempfile
import uuid

import pytest
from fault_injection import ENV, with_quick_xla
from storage_emulator import Emulator, use_emulator

# The processes the tests start (``env=ENV``) share JAX's persistent compilation cache: the same small programs are
# compiled again and again in new processes (each kill and resume, each process of a launch), and a cached one
# loads in about 2 s instead of 10 on two cores. This process keeps compiling its own (its tests time compiles).
# Under pytest-xdist the controller makes the folder and its workers share it (they inherit its environment).
_JAX_CACHE = os.environ.get("TPU_PRETRAIN_TESTS_JAX_CACHE")
if not _JAX_CACHE:
    _JAX_CACHE = os.environ["TPU_PRETRAIN_TESTS_JAX_CACHE"] = tempfile.mkdtemp(prefix="tpu-pretrain-tests-jax-cache-")
    atexit.register(shutil.rmtree, _JAX_CACHE, ignore_errors=True)
# The processes the tests start compile at XLA's optimisation level 0: they run a few steps of small models, so
# compiling is most of their time, and unoptimised code compiles in about half of it. (In the test processes
# themselves it gained nothing: TensorFlow's tests do not use XLA on the CPU.) The image-exact environments compile
# for TPUs, whose compiler is not the one under test here: left as is.
if not os.environ.get("TPU_PRETRAIN_IMAGE"):
    ENV["XLA_FLAGS"] = with_quick_xla(ENV.get("XLA_FLAGS", ""))
ENV.update({"JAX_COMPILATION_CACHE_DIR": _JAX_CACHE, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"})


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    """gcp-storage-emulator in a subprocess on a free loopback port (killed at the end of the module)."""
    emu = Emulator(tmp_path_factory.mktemp("gcs") / "data").start()
    yield emu
    emu.kill()


@pytest.fixture
def bucket(emulator, monkeypatch, tmp_path):
    """A fresh bucket on the emulator, with the client pointed at it; its name."""
    from tpu_pretrain.storage import auth

    use_emulator(emulator.url, monkeypatch, tmp_path)
    name = f"test-{uuid.uuid4().hex[:10]}"
    auth.storage_client().create_bucket(name)
    yield name
    auth.reset()


@pytest.fixture
def mount_tmpfs(tmp_path):
    """Mount a small tmpfs (root only; the test skips elsewhere), read-only or filled to the last byte (``full``:
    the kernel answers the next write with ENOSPC); unmounted at the end."""
    mounted = []

    def mount(name, size="4m", read_only=False, full=False):
        path = tmp_path / name
        path.mkdir()
        options = f"size={size}" + (",ro" if read_only else "")
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
        if result.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
        mounted.append(path)
        if full:
            _fill(path / "filler")
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)])


def _fill(path):
    with open(path, "wb", buffering=0) as handle:
        for size in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    handle.write(b"\0" * size)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise


# Under pytest-xdist (`make test`) each test file runs whole on one worker. pytest-xdist 3.7 and later hand out the
# files with the most tests first, this order breaking ties only. Handing them out in this order instead (the longest
# first) was tried on two cores: the main suite 730 s, against 681 and 760 in two runs of xdist's order (both
# suites keep the cores ~95% busy, so the order moves little), and xdist's order was kept.
LONGEST_FIRST = ("test_notebooks.py", "test_benchmarks.py", "test_modernbert_training.py", "test_multiprocess.py",
                 "test_tpu_compilation.py", "test_faults.py", "test_parity.py", "test_probe.py", "test_jax_stack.py",
                 "test_resume.py", "test_multi_worker.py")


def pytest_collection_modifyitems(items):
    rank = {name: place for place, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
