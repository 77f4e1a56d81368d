"""Shared fixtures: for the tests that talk to Cloud Storage, a real API server on loopback and a bucket; for the
tests of read-only and full disks, small real file systems; for the processes the tests start, one JAX compilation
cache."""

import atexit
import errno
import shutil
import subprocess
import tempfile
import uuid

import pytest
from fault_injection import ENV
from storage_emulator import Emulator, use_emulator

# The processes the tests start (``env=ENV``) share JAX's persistent compilation cache: the same small programs are
# compiled again and again in new processes (each kill and resume, each process of a launch), and a cached one
# loads in about 2 s instead of 10 on two cores. This process keeps compiling its own (its tests time compiles).
_JAX_CACHE = tempfile.mkdtemp(prefix="tpu-pretrain-tests-jax-cache-")
atexit.register(shutil.rmtree, _JAX_CACHE, ignore_errors=True)
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
