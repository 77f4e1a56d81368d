"""Where the shared real-text corpora are; tests that need them skip when the folder is absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CORPORA = Path(os.environ.get("TPU_PRETRAIN_CORPORA", Path(__file__).resolve().parents[2] / "shared" / "corpora"))
WIKITEXT = CORPORA / "wikitext2_valid.txt"
ZH_FORTUNES = CORPORA / "zh_fortunes.txt"
BERT_SAMPLE = CORPORA / "bert_sample_text.txt"

needs_corpora = pytest.mark.skipif(not WIKITEXT.is_file(), reason=f"shared corpora not found at {CORPORA}")
