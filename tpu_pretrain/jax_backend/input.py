"""The training and eval input of the JAX backend: BERT-schema shards read without TensorFlow.

Order: every epoch is one pseudo-random permutation of *all* the training records (a global shuffle),
keyed by ``(train_seed, epoch)``. The permutation is a keyed Feistel network on the record indices with
cycle-walking, so the record at any position is computed directly: position ``p`` (records consumed)
is record ``permute(p mod N)`` of epoch ``p // N``, where record ``g`` is record ``g - first[f]`` of
the ``f``-th shard in name order. Resuming at a step therefore reads exactly the records the
uninterrupted run would have read, with no skipping through the data. Example ids are the TensorFlow
backend's (:mod:`..core.example_ids`).

Reading: an index of each shard's record offsets (one pass over the record headers), random reads
through a memory map with each record's CRC checked, batches decoded with NumPy
(:func:`..data.tfrecord.decode_examples`), and a few batches built ahead in background threads.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import os
from collections import deque

import numpy as np

from ..core.example_ids import example_id
from ..data.data_folder import corrupt_shard_error, feature_shapes
from ..data.dynamic_masking import DynamicMasking, dynamic_mask
from ..data.tfrecord import CorruptRecord, RecordFile, decode_examples
from ..data.vocab import Vocab
from ..errors import UserInputError

# What a training step takes: the model's inputs and what the losses compare them with.
BATCH_FEATURES = ("input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights",
                  "next_sentence_labels")
ROUNDS = 4
_MASK64 = np.uint64((1 << 64) - 1)

log = logging.getLogger(__name__)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a well-mixed 64-bit hash of each value (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def permute(indices: np.ndarray, n: int, seed: int, epoch: int) -> np.ndarray:
    """A pseudo-random permutation of ``range(n)`` keyed by (seed, epoch), applied to ``indices``."""
    bits = max(2, int(n - 1).bit_length())
    half = (bits + 1) // 2
    low = np.uint64((1 << half) - 1)
    with np.errstate(over="ignore"):
        keys = [_mix(np.uint64(seed & 0xFFFFFFFF) << np.uint64(32) ^ np.uint64(epoch * ROUNDS + r))
                for r in range(ROUNDS)]

        def rounds(x):
            left, right = x >> np.uint64(half), x & low
            for key in keys:
                left, right = right, left ^ (_mix(right ^ key) & low)
            return left << np.uint64(half) | right

        out = rounds(np.asarray(indices, dtype=np.uint64))
        outside = out >= n
        while outside.any():  # cycle-walking: apply again until the value falls inside range(n)
            out[outside] = rounds(out[outside])
            outside = out >= n
    return out.astype(np.int64)


class ShardSet:
    """The records of a set of shards, addressed by one global index (shards in name order)."""

    def __init__(self, files: list[str]):
        self.files = sorted(files)
        try:
            self.shards = [RecordFile(f) for f in self.files]
        except CorruptRecord as exc:
            raise corrupt_shard_error(os.path.dirname(self.files[0]), exc) from None
        counts = [len(s) for s in self.shards]
        self.first = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        self.total = int(self.first[-1])
        if not self.total:
            raise UserInputError(f"The shards {', '.join(self.files[:3])} hold no records.")

    def locate(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard, record within the shard) of global record indices."""
        shard = np.searchsorted(self.first, index, side="right") - 1
        return shard, index - self.first[shard]

    def read(self, shard: np.ndarray, record: np.ndarray) -> list[bytes]:
        return [self.shards[s].read(r) for s, r in zip(shard.tolist(), record.tolist(), strict=True)]


class TrainingBatches:
    """Global training batches from ``start_record`` on: ``(example ids, {feature: array})`` each.

    ``masking``: mask every example afresh (:func:`..data.dynamic_masking.dynamic_mask`), keyed by (seed, example
    id), so a resumed run reads the very batches, masks included, that the uninterrupted run would have read.
    ``rows``: the rows of each global batch this process reads (several processes: the rows that land on its
    devices); the ids are the whole batch's, which cost no reading, so the chief logs every example.
    """

    def __init__(self, files: list[str], batch_size: int, max_seq_length: int, max_predictions_per_seq: int, *,
                 seed: int, start_record: int = 0, prefetch: int = 8, workers: int = 2,
                 masking: DynamicMasking | None = None, rows: slice = slice(None)):
        self.records = ShardSet(files)
        self.batch_size, self.seed, self.masking, self.rows = batch_size, seed, masking, rows
        self.shapes = feature_shapes(max_seq_length, max_predictions_per_seq)
        self._next = start_record // batch_size
        self._offset = start_record - self._next * batch_size
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="input")
        self._pending: deque = deque()
        for _ in range(prefetch):
            self._submit()

    def positions(self, batch_index: int) -> np.ndarray:
        start = self._offset + batch_index * self.batch_size
        return np.arange(start, start + self.batch_size, dtype=np.int64)

    def batch(self, batch_index: int) -> tuple[np.ndarray, dict]:
        """The ``batch_index``-th global batch (its ids, and the features of ``rows``): a pure function of (seed,
        records consumed)."""
        positions = self.positions(batch_index)
        n = self.records.total
        epochs, within = np.divmod(positions, n)
        index = np.empty_like(positions)
        for epoch in np.unique(epochs):
            chosen = epochs == epoch
            index[chosen] = permute(within[chosen], n, self.seed, int(epoch))
        shard, record = self.records.locate(index)
        ids, mine = example_id(epochs, shard, record), self.rows
        features = to_model_dtypes(decoded(self.records, shard[mine], record[mine], self.shapes))
        if self.masking is not None:
            features = dynamic_mask(features, ids[mine], self.seed, self.masking)
        return ids, features

    def _submit(self) -> None:
        self._pending.append(self._pool.submit(self.batch, self._next))
        self._next += 1

    def __iter__(self):
        return self

    def __next__(self) -> tuple[np.ndarray, dict]:
        future = self._pending.popleft()
        self._submit()
        return future.result()

    def close(self) -> None:
        for future in self._pending:
            future.cancel()
        self._pool.shutdown(wait=True)


def decoded(records: ShardSet, shard: np.ndarray, record: np.ndarray, shapes: dict) -> dict:
    """The features of these records; a damaged one is named as the TensorFlow backend names it, not a traceback."""
    try:
        return decode_examples(records.read(shard, record), shapes)
    except ValueError as exc:  # a CRC that does not match, or a record that is not an Example
        raise corrupt_shard_error(os.path.dirname(records.files[0]), exc) from None


def batch_shapes(batch_size: int, max_seq_length: int, max_predictions_per_seq: int) -> dict[str, tuple]:
    """``{feature: (shape, dtype)}`` of a batch as :func:`to_model_dtypes` gives it to a training step."""
    shapes = {}
    for name, (dtype, length) in feature_shapes(max_seq_length, max_predictions_per_seq).items():
        if name in BATCH_FEATURES:
            shape = (batch_size,) if name == "next_sentence_labels" else (batch_size, length)
            shapes[name] = (shape, np.float32 if dtype == "float32" else np.int32)
    return shapes


def to_model_dtypes(features: dict) -> dict:
    """int64 features as int32 (what accelerators prefer), ``next_sentence_labels`` as a vector."""
    out = {k: v.astype(np.int32) if v.dtype == np.int64 else v for k, v in features.items()}
    out["next_sentence_labels"] = out["next_sentence_labels"].reshape(-1)
    return out


def eval_batches(files: list[str], batch_size: int, max_seq_length: int, max_predictions_per_seq: int,
                 max_batches: int | None = None):
    """The eval shards' records in order, in batches of ``batch_size`` (the last one shorter: every record is
    evaluated, as ``evaluate`` does), at most ``max_batches``."""
    records = ShardSet(files)
    shapes = feature_shapes(max_seq_length, max_predictions_per_seq)
    count = -(-records.total // batch_size)
    for b in itertools.islice(range(count), max_batches or None):
        rows = np.arange(b * batch_size, min((b + 1) * batch_size, records.total), dtype=np.int64)
        shard, record = records.locate(rows)
        yield to_model_dtypes(decoded(records, shard, record, shapes))


def document_separator(plan) -> int | None:
    """The [SEP] id that ends documents when the run keeps them apart (the resolver's ``document_masks``:
    :mod:`..core.document_masks`), else None."""
    if plan.config.train.document_masks != "on":
        return None
    return separator_id(plan.model_config, plan.vocab)


def separator_id(model_config, vocab: Vocab | str | None) -> int:
    """The [SEP] id: ModernBERT's config says it; BERT's is the vocab's ``[SEP]``; no vocab yet (the plan command
    before the data exists): the id ``tpu-pretrain vocab`` gives it, as the planned ModernBERT config takes it."""
    sep = getattr(model_config, "sep_token_id", None)
    if sep is None and vocab is None:
        from ..data.vocab_tokenizer import SPECIAL_TOKENS

        sep = SPECIAL_TOKENS.index("[SEP]")
    if sep is None:
        vocab = vocab if isinstance(vocab, Vocab) else Vocab.read(vocab)
        if "[SEP]" not in vocab.tokens:
            raise UserInputError(f"document_masks on: the vocab {vocab.setting} has no [SEP] to end documents by; "
                                 "set --document_masks off.")
        sep = vocab.tokens.index("[SEP]")
    return int(sep)
