"""Each JAX test runs once, in the environment it belongs to: the JAX backend's own (``.venv-jax``, without
TensorFlow: ``make test-jax-stack``), except the comparisons of the two backends, which need both (``.venv``)."""

import importlib.util
from pathlib import Path

BOTH_BACKENDS = {"test_parity.py"}  # TensorFlow's results against JAX's: the environment that has both

_HERE = Path(__file__).parent
if importlib.util.find_spec("tensorflow") is not None:
    collect_ignore = [p.name for p in _HERE.glob("test_*.py") if p.name not in BOTH_BACKENDS]
else:
    collect_ignore = sorted(BOTH_BACKENDS)
