"""Dynamic masking (RoBERTa-style): each time a sequence is read, its stored masks are undone and drawn afresh.

Both backends mask by one rule, stated here with what the vocab contributes (:class:`DynamicMasking`):
restore the original tokens from ``masked_lm_positions``/``masked_lm_ids``; choose ``round(masked_lm_prob *
candidates)`` positions (at least 1, at most ``max_predictions_per_seq``) among the real tokens ([CLS], [SEP]
and padding excluded), token by token; replace 80% with [MASK], keep 10%, and put a random token from
``replacement_ids`` (never a special or ``[unusedN]`` token, as in create-data) in the other 10%. The
TensorFlow backend masks inside its tf.data graph (:func:`..tf_backend.input.dynamic_mask`); the JAX backend
masks NumPy batches on the host with :func:`dynamic_mask`. Their random streams differ (TensorFlow's
stateless generator; SplitMix64 here), so the two agree in distribution, not draw for draw.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .vocab import Vocab, replacement_ids

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # SplitMix64's increment
_MASK64 = (1 << 64) - 1
SCORES, CHOICES, TOKENS = 0, 1, 2  # the three random streams of an example


@dataclass
class DynamicMasking:
    """What dynamic masking needs to know about the vocab.

    Random replacement tokens come from ``replacement_ids``: the same rule as the static masking of
    create-data (never a special token or an ``[unusedN]`` placeholder).
    """

    mask_id: int
    cls_id: int
    sep_id: int
    replacement_ids: np.ndarray
    masked_lm_prob: float = 0.15

    @classmethod
    def from_vocab(cls, vocab: Vocab, masked_lm_prob: float = 0.15) -> DynamicMasking:
        tokens = vocab.tokens
        index = {t: i for i, t in enumerate(tokens)}
        return cls(index["[MASK]"], index["[CLS]"], index["[SEP]"],
                   np.asarray(replacement_ids(tokens), dtype=np.int32), masked_lm_prob)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a well-mixed 64-bit hash of each value (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def example_keys(seed: int, example_ids: np.ndarray) -> np.ndarray:
    """One 64-bit key per example from (seed, example id): the masks of an example depend on nothing else."""
    with np.errstate(over="ignore"):
        return _mix(_mix(np.uint64(seed & _MASK64)) ^ np.asarray(example_ids).astype(np.uint64))


def uniforms(keys: np.ndarray, stream: int, count: int) -> np.ndarray:
    """``[len(keys), count]`` uniform draws in [0, 1): SplitMix64 at counters (stream, 0..count-1) of each key."""
    counters = (np.uint64(stream) << np.uint64(32)) | np.arange(1, count + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        bits = _mix(keys[:, None] + counters[None, :] * _GOLDEN)
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53


def dynamic_mask(features: dict, example_ids: np.ndarray, seed: int, spec: DynamicMasking) -> dict:
    """A batch of NumPy features masked afresh; each example's masks a pure function of (seed, example id).

    ``features`` holds ``input_ids``, ``input_mask``, ``masked_lm_positions``, ``masked_lm_ids`` and
    ``masked_lm_weights`` as ``[batch, ...]`` arrays; the other features pass through. The example ids count
    epochs (:mod:`..jax_backend.input`), so an example is masked anew in every epoch, and the same way again
    when a resumed run reads it at the same position.
    """
    ids = np.array(features["input_ids"], dtype=np.int32)
    positions, weights = features["masked_lm_positions"], features["masked_lm_weights"]
    batch, seq_len = ids.shape
    max_pred = positions.shape[1]
    rows, slots = np.nonzero(weights > 0)
    ids[rows, positions[rows, slots]] = features["masked_lm_ids"][rows, slots]  # the original tokens

    candidates = (features["input_mask"] > 0) & (ids != spec.cls_id) & (ids != spec.sep_id)
    n_candidates = candidates.sum(axis=1)
    # float32, rounding half to even: TensorFlow's arithmetic, so both backends mask as many tokens per sequence.
    n_mask = np.round(n_candidates.astype(np.float32) * np.float32(spec.masked_lm_prob)).astype(np.int64)
    n_mask = np.minimum(np.maximum(n_mask, 1), np.minimum(max_pred, n_candidates))
    keys = example_keys(seed, example_ids)
    scores = np.where(candidates, uniforms(keys, SCORES, seq_len), -1.0)
    picked = np.argsort(-scores, axis=1, kind="stable")[:, :max_pred]
    keep = np.arange(max_pred)[None, :] < n_mask[:, None]
    picked = np.sort(np.where(keep, picked, seq_len), axis=1)  # ascending, unused slots last
    keep = picked < seq_len
    new_positions = np.where(keep, picked, 0).astype(np.int32)
    labels = np.take_along_axis(ids, new_positions, axis=1) * keep

    choice = uniforms(keys, CHOICES, max_pred)
    count = len(spec.replacement_ids)
    drawn = np.minimum((uniforms(keys, TOKENS, max_pred) * count).astype(np.int64), count - 1)
    random_tokens = np.asarray(spec.replacement_ids, np.int32)[drawn]
    replacement = np.where(choice < 0.8, spec.mask_id, np.where(choice < 0.9, labels, random_tokens))
    rows, slots = np.nonzero(keep)
    ids[rows, new_positions[rows, slots]] = replacement[rows, slots]
    return {**features, "input_ids": ids, "masked_lm_positions": new_positions,
            "masked_lm_ids": labels.astype(np.int32), "masked_lm_weights": keep.astype(np.float32)}
