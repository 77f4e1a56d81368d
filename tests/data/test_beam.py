"""create-data on Apache Beam's DirectRunner, through the real CLI, against the local path on the shared corpora:
the same shard bytes and the same manifest figures."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
from corpora import BERT_SAMPLE, WIKITEXT, ZH_FORTUNES, needs_corpora

from tpu_pretrain.config import Config
from tpu_pretrain.data.create import create_pretraining_data
from tpu_pretrain.data.vocab import build_vocab

pytest.importorskip("apache_beam", reason="the beam extra is not installed")

SETTINGS = {"max_seq_length": 64, "max_predictions_per_seq": 10, "dupe_factor": 1, "num_shards": 3,
            "eval_fraction": 0.02, "do_whole_word_mask": True}


def _folder(path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir()) if p.is_file()}


@needs_corpora
def test_the_direct_runner_writes_the_local_paths_shards_and_manifest(tmp_path):
    inputs = [str(WIKITEXT), str(BERT_SAMPLE), str(ZH_FORTUNES)]
    vocab = build_vocab(Config.load(input=inputs, vocab_size=7000, vocab_sample_lines=20_000,
                                    output_dir=str(tmp_path / "vocab"))).path
    local = create_pretraining_data(Config.load(input=inputs, vocab_file=str(vocab), output_dir=str(tmp_path / "local"),
                                                workers=2, **SETTINGS))
    flags = [f"--{key}={value}" for key, value in SETTINGS.items() if not isinstance(value, bool)]
    flags += [f"--{key}" for key, value in SETTINGS.items() if value is True]
    done = subprocess.run([sys.executable, "-m", "tpu_pretrain", "create-data", "--runner", "DirectRunner",
                           "--input", *inputs, "--vocab_file", str(vocab), "--output_dir", str(tmp_path / "beam"),
                           *flags], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    local_files, beam_files = _folder(tmp_path / "local"), _folder(tmp_path / "beam")
    shards = sorted(name for name in local_files if name.endswith(".tfrecord"))
    assert len(shards) == 4 and local.totals("train")["instances"] > 1000
    assert {n: beam_files.get(n) for n in shards} == {n: local_files[n] for n in shards}
    assert set(beam_files) == set(local_files), "the two folders hold different files"
    figures = [json.loads((tmp_path / side / "manifest.json").read_text()) for side in ("local", "beam")]
    for manifest in figures:
        manifest.pop("seconds")
    assert figures[0] == figures[1]
    assert not (tmp_path / "beam" / ".work").exists()
