"""The one private JAX API the package leans on, checked where it stands: the coordination service's key-value store
(``jax._src.distributed.global_state.client``), which several processes use for their roll call and to compare their
settings (:mod:`tpu_pretrain.jax_backend.processes`). JAX has no public API for it; when a JAX release moves or
renames it, this test fails by name instead of a lost process going unnamed.

A real one-process runtime on a loopback port, in a process of its own (``jax.distributed`` is process-wide).
"""

import os
import socket
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("jax")


def test_the_coordination_key_value_store_is_where_processes_py_reads_it():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = textwrap.dedent(f"""
        import jax
        jax.distributed.initialize(coordinator_address="127.0.0.1:{port}", num_processes=1, process_id=0)
        from tpu_pretrain.jax_backend.processes import _client
        client = _client()
        client.key_value_set("tpu_pretrain/test/0", "here")
        assert client.blocking_key_value_get("tpu_pretrain/test/0", 5000) == "here"
        assert [v for _, v in client.key_value_dir_get("tpu_pretrain/test")] == ["here"]
        jax.distributed.shutdown()
        print("KV OK")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={"JAX_PLATFORMS": "cpu", **os.environ})
    assert "KV OK" in done.stdout, done.stderr[-3000:]
