"""Each JAX test runs once, in the environment it belongs to: the JAX backend's own (``.venv-jax``, without
TensorFlow: ``make test-jax-stack``), except the comparisons of the two backends, which need both (``.venv``).
There the tests' own compiles are quick too, as the processes they start (tests/conftest.py)."""

import importlib.util
import os
from pathlib import Path

from fault_injection import ENV, QUICK_XLA, with_quick_xla

BOTH_BACKENDS = {"test_parity.py"}  # TensorFlow's results against JAX's: the environment that has both

_HERE = Path(__file__).parent
if importlib.util.find_spec("tensorflow") is not None:
    collect_ignore = [p.name for p in _HERE.glob("test_*.py") if p.name not in BOTH_BACKENDS]
else:
    collect_ignore = sorted(BOTH_BACKENDS)
    # XLA's quick level for this process's compiles, read when JAX makes its CPU client (after this): small models,
    # a few steps. Measured on the attention, ModernBERT, splash and document-mask tests: 128 -> 99 s of CPU;
    # where the processes the tests start compile quickly too: not in the images' environments (tests/conftest.py).
    if QUICK_XLA in ENV.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = with_quick_xla(os.environ.get("XLA_FLAGS", ""))
