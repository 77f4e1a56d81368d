"""Fresh processes for the TPU stack's tests: one that imports the package beside a (fake) TPU build and shows the
variables it set, and ``tpu-check`` itself; shared by the TPU environment's tests and the standard build's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tpu_pretrain import environment

ROOT = Path(__file__).resolve().parents[1]

IMPORT_AND_SHOW = textwrap.dedent("""
    import json, os, sys, types
    if sys.argv[1] == "tensorflow-first":  # what a notebook does when it imports TensorFlow before tpu_pretrain
        layer = type("Layer", (), {"__module__": "tf_keras.src.engine.base_layer"})
        sys.modules["tensorflow"] = types.SimpleNamespace(keras=types.SimpleNamespace(
            layers=types.SimpleNamespace(Layer=layer)))
    import tpu_pretrain
    from tpu_pretrain import environment
    names = environment.PJRT_VARIABLES + ("TPU_LOAD_LIBRARY", "TPU_LIBRARY_PATH", "TF_XLA_FLAGS")
    at_import = environment.tpu_variables_at_import()
    print(json.dumps({"env": {k: os.environ.get(k) for k in names}, "at_import": at_import}))
""")


def import_tpu_pretrain(site: Path, order: str = "package-first", **variables) -> dict:
    """Import tpu_pretrain in a fresh process that sees a (fake) tensorflow-tpu and libtpu; the variables it set."""
    env = {k: v for k, v in os.environ.items() if k not in environment.PJRT_VARIABLES + (
        "TPU_LOAD_LIBRARY", "TPU_LIBRARY_PATH", "TF_XLA_FLAGS", "ISTPUVM", "TPU_ACCELERATOR_TYPE",
        "TPU_PROCESS_ADDRESSES", "COLAB_TPU_ADDR")}
    env.update(PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]), **variables)
    done = subprocess.run([sys.executable, "-c", IMPORT_AND_SHOW, order], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def tpu_check(*args, **variables) -> tuple[int, str]:
    """``tpu-pretrain tpu-check ARGS`` in a fresh process (this machine not taken for a TPU VM unless told)."""
    env = {k: v for k, v in os.environ.items() if k not in ("ISTPUVM", "TPU_ACCELERATOR_TYPE")}
    env.update(variables)
    done = subprocess.run([sys.executable, "-m", "tpu_pretrain", "tpu-check", *args], capture_output=True,
                          text=True, env=env, timeout=900)
    return done.returncode, done.stdout
