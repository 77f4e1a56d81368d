"""Small BERT-schema shards for the training tests (the real pipeline may not be available)."""

from __future__ import annotations

import json
import os

import numpy as np


def write_vocab(path: str, size: int) -> str:
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"tok{i}" for i in range(size - 5)]
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(tokens) + "\n")
    return path


def synthetic_instances(n: int, seq_len: int, max_pred: int, vocab_size: int, seed: int = 0):
    """Learnable toy sequences: each token is (previous + 1) mod range, with BERT-style masking."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.integers(seq_len // 2, seq_len + 1))
        start = int(rng.integers(5, vocab_size))
        body = [5 + (start + i) % min(vocab_size - 5, 20) for i in range(length - 3)]
        cut = len(body) // 2
        ids = [2] + body[:cut] + [3] + body[cut:] + [3]
        segments = [0] * (cut + 2) + [1] * (len(body) - cut + 1)
        candidates = [i for i, t in enumerate(ids) if t not in (2, 3)]
        n_mask = min(max_pred, max(1, round(len(candidates) * 0.15)))
        positions = sorted(rng.choice(candidates, n_mask, replace=False).tolist())
        labels = [ids[p] for p in positions]
        masked = list(ids)
        for p in positions:
            masked[p] = 4
        pad = seq_len - len(ids)
        out.append({
            "input_ids": masked + [0] * pad,
            "input_mask": [1] * len(ids) + [0] * pad,
            "segment_ids": segments + [0] * pad,
            "masked_lm_positions": positions + [0] * (max_pred - n_mask),
            "masked_lm_ids": labels + [0] * (max_pred - n_mask),
            "masked_lm_weights": [1.0] * n_mask + [0.0] * (max_pred - n_mask),
            "next_sentence_labels": [int(rng.integers(0, 2))],
        })
    return out


def write_shards(folder: str, instances_by_split: dict, seq_len: int, max_pred: int, vocab_size: int,
                 shards_per_split: int = 2) -> str:
    """Write ``train-*``/``eval-*`` shards and a manifest.json in the project's data layout."""
    import tensorflow as tf

    from tpu_pretrain.data.data_folder import Manifest, ShardStats

    os.makedirs(folder, exist_ok=True)
    manifest = Manifest(settings={"max_seq_length": seq_len, "max_predictions_per_seq": max_pred},
                        vocab_size=vocab_size, vocab_sha256="", inputs=[], corpus_report="written by a test")
    for split, instances in instances_by_split.items():
        count = shards_per_split if split == "train" else 1
        for shard in range(count):
            name = f"{split}-{shard:05d}-of-{count:05d}.tfrecord"
            part = instances[shard::count]
            with tf.io.TFRecordWriter(os.path.join(folder, name)) as writer:
                for inst in part:
                    feature = {}
                    for key, values in inst.items():
                        if key == "masked_lm_weights":
                            feature[key] = tf.train.Feature(float_list=tf.train.FloatList(value=values))
                        else:
                            feature[key] = tf.train.Feature(int64_list=tf.train.Int64List(value=values))
                    example = tf.train.Example(features=tf.train.Features(feature=feature))
                    writer.write(example.SerializeToString(deterministic=True))
            manifest.shards.append(ShardStats(file=name, split=split, instances=len(part)))
    with open(os.path.join(folder, "manifest.json"), "w") as handle:
        json.dump(manifest.to_json(), handle, indent=2)
    return folder


def synthetic_data_folder(folder: str, train: int, evals: int, seq_len: int = 32, max_pred: int = 5,
                          vocab_size: int = 200) -> str:
    """A data folder of learnable toy instances: train and eval shards, manifest.json and vocab.txt."""
    write_shards(folder, {"train": synthetic_instances(train, seq_len, max_pred, vocab_size),
                          "eval": synthetic_instances(evals, seq_len, max_pred, vocab_size, seed=1)},
                 seq_len, max_pred, vocab_size)
    write_vocab(os.path.join(folder, "vocab.txt"), vocab_size)
    return folder
