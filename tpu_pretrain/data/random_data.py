"""A data folder of random tokens, written by the package's own writers: for the accelerator probes (what a chip
does, before any corpus exists) and the benchmarks.

Read back by the package's reader, so a change to the data-folder contract fails loudly where these folders are
made instead of leaving one that training cannot read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..storage.local import write_text_atomic
from .data_folder import EVAL, MANIFEST, TRAIN, VOCAB, DataInfo, Manifest, ShardStats, read_data_info, shard_name
from .tfrecord import AtomicRecordWriter
from .vocab import SPECIAL_TOKENS, Vocab


def random_batch(n: int, seq: int, pred: int, vocab: int, seed: int = 0, no_nsp: bool = False
                 ) -> dict[str, np.ndarray]:
    """``n`` instances of random tokens: full length, two segments (``no_nsp``: one, as MLM-only data has),
    ``pred`` masked positions each."""
    rng = np.random.default_rng(seed)
    positions = np.sort(np.stack([rng.choice(np.arange(1, seq - 1), pred, replace=False) for _ in range(n)]), 1)
    segments = (np.arange(seq)[None] >= seq // 2).astype(np.int64).repeat(n, 0)
    return {"input_ids": rng.integers(5, vocab, (n, seq)), "input_mask": np.ones((n, seq), np.int64),
            "segment_ids": segments * (not no_nsp),
            "masked_lm_positions": positions, "masked_lm_ids": rng.integers(5, vocab, (n, pred)),
            "masked_lm_weights": np.ones((n, pred), np.float32),
            "next_sentence_labels": rng.integers(0, 2, (n, 1)) * (not no_nsp)}


def write_random_data_folder(folder: str | os.PathLike, n: int, seq: int, pred: int, vocab: int,
                             eval_n: int = 0, no_nsp: bool = False) -> DataInfo:
    """A complete data folder of random tokens (``n`` training and ``eval_n`` eval instances): shards, vocab.txt
    and manifest.json, read back as the trainers read it. ``no_nsp``: MLM-only data (what ModernBERT trains on)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokens = list(SPECIAL_TOKENS) + [f"tok{i}" for i in range(vocab - len(SPECIAL_TOKENS))]
    write_text_atomic(folder / VOCAB, "\n".join(tokens) + "\n")
    shards = []
    for split, count, seed in ((TRAIN, n, 0), (EVAL, eval_n, 1)):
        if not count:
            continue
        name = shard_name(split, 0, 1)
        writer = AtomicRecordWriter(folder / name)
        writer.write_examples(random_batch(count, seq, pred, vocab, seed, no_nsp))
        sha256 = writer.close()
        shards.append(ShardStats(file=name, split=split, documents=count, sentences=2 * count,
                                 tokens=count * (seq - 3), instances=count, masked_tokens=count * pred,
                                 real_tokens=count * (seq - 3), random_next=0 if no_nsp else count // 2,
                                 bytes=writer.bytes, sha256=sha256))
    manifest = Manifest(settings={"max_seq_length": seq, "max_predictions_per_seq": pred, "no_nsp": no_nsp},
                        vocab_size=vocab, vocab_sha256=Vocab.read(folder / VOCAB).sha256, inputs=[],
                        corpus_report="random tokens", shards=shards)
    write_text_atomic(folder / MANIFEST, json.dumps(manifest.to_json(), indent=2, sort_keys=True) + "\n")
    return read_data_info(str(folder))
