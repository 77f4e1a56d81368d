"""The first create-data on a machine compiles its fast paths (numba: about 40 s on two cores) and says so in one
line before it starts, however many worker processes compile at once; once the compiled code is cached, nothing
is said. The cache here is a fresh folder (NUMBA_CACHE_DIR), so the compile is the real one a new machine does."""

from __future__ import annotations

import os
import subprocess
import sys

from tpu_pretrain.config import Config
from tpu_pretrain.data.compiled import COMPILING
from tpu_pretrain.data.sample_corpus import write_sample_corpus
from tpu_pretrain.data.vocab import build_vocab

NOTICE = COMPILING.split("(")[0]  # "Compiling the fast tokenizer and masking paths "


def create_data(corpus, vocab, out, cache, workers: int) -> str:
    """``tpu-pretrain create-data`` with numba's cache in ``cache``; what it printed (stdout and stderr)."""
    done = subprocess.run(
        [sys.executable, "-m", "tpu_pretrain", "create-data", "--input", str(corpus), "--vocab_file", str(vocab),
         "--output_dir", str(out), "--num_shards", "2", "--workers", str(workers)],
        capture_output=True, text=True, timeout=900, env={**os.environ, "NUMBA_CACHE_DIR": str(cache)})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def test_a_cold_compile_is_said_once_and_a_cached_one_not_at_all(tmp_path):
    corpus = write_sample_corpus(tmp_path / "corpus.txt", max_chars=30_000)
    vocab = build_vocab(Config.load(input=[str(corpus)], vocab_size=1000, output_dir=str(tmp_path))).path
    cache = tmp_path / "numba-cache"
    cold = create_data(corpus, vocab, tmp_path / "first", cache, workers=2)  # two workers compiling at once
    lines = [line for line in cold.splitlines() if line.startswith(NOTICE)]
    assert lines == ["Compiling the fast tokenizer and masking paths (once per install, about 40 s on two cores)..."], \
        cold
    assert any(cache.rglob("*.nbi"))  # and the compiled code was cached where NUMBA_CACHE_DIR says
    warm = create_data(corpus, vocab, tmp_path / "second", cache, workers=1)  # in this process: loaded, not compiled
    assert NOTICE not in warm, warm
