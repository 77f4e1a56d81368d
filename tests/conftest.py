"""Fixtures shared by the tests that talk to Cloud Storage: a real API server on loopback, and a bucket."""

import uuid

import pytest
from storage_emulator import Emulator, use_emulator


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
