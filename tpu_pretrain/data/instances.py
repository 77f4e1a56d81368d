"""BERT pretraining instances: Google's algorithm, a batch of instances at a time.

Segments follow ``create_instances_from_document`` of the original ``create_pretraining_data.py``:
a target length (shorter with ``short_seq_prob``), sentences gathered into a chunk, a random split
into A and B, B replaced by a span of another document half the time (always when the chunk holds
one sentence), the longer segment truncated from a random end. Masking follows
``create_masked_lm_predictions``: candidates are words (or WordPieces), shuffled, taken greedily
while they fit the budget, each masked token 80% [MASK], 10% random, 10% unchanged.

What makes this fast is that no per-instance work touches tokens in Python: a block's documents are one flat
token array (:class:`TokenBlock`), so an instance is four numbers, the spans of its segments A and B
(:class:`Instances`); Google's loop decides the spans on sentence lengths alone (compiled, :mod:`.pair_loop`),
and a whole batch is laid out and masked at once (compiled loops per row, :mod:`.masking_kernels`, with the
random draws made here in NumPy).

Deviations, each deliberate: the budget is ``masked_lm_prob`` of the real tokens ([CLS]/[SEP] are
never candidates, so they are not counted either); random replacements are drawn from real
vocabulary entries, never special or ``[unusedN]`` tokens; the random next document comes from the
same block of the same shard, which bounds memory; with ``no_nsp`` B is always the true continuation.

Packing (:class:`SequencePacker`, RoBERTa's "full-sentences" format, MLM only) replaces the segment
pairs: consecutive sentences fill every sequence to ``max_seq_length``, crossing document boundaries
with a ``[SEP]`` between documents; a sentence that does not fit is cut at a word start and goes on in
the next sequence, so every token is used exactly once per pass and no word is split.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from .masking_kernels import greedy_selection, layout, predictions, words
from .pair_loop import segment_pairs

# A sentence: its token ids and, for whole-word masking, which tokens continue the previous word.
Sentence = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class InstanceSpec:
    max_seq_length: int
    max_predictions_per_seq: int
    masked_lm_prob: float
    short_seq_prob: float
    do_whole_word_mask: bool
    nsp: bool
    cls_id: int
    sep_id: int
    mask_id: int
    replacement_ids: np.ndarray  # ids a "random token" may be drawn from


_EMPTY_IDS = np.zeros(0, dtype=np.int32)
_EMPTY_FLAGS = np.zeros(0, dtype=bool)


class TokenBlock:
    """A block's documents as one flat token array: every sentence, and so every run of consecutive sentences
    of a document, is a span of it, so an instance is four numbers rather than arrays cut and joined."""

    def __init__(self, docs: list[list[Sentence]]):
        sentences = [s for doc in docs for s in doc]
        self.ids = np.concatenate([s[0] for s in sentences]) if sentences else _EMPTY_IDS
        self.cont = np.concatenate([s[1] for s in sentences]) if sentences else _EMPTY_FLAGS
        self.lengths = np.array([len(s[0]) for s in sentences], dtype=np.int64)  # per sentence
        self.starts = np.cumsum(self.lengths) - self.lengths  # per sentence, in ids
        self.doc_first = np.cumsum([0] + [len(doc) for doc in docs], dtype=np.int64)  # a document's first sentence

    def __len__(self) -> int:
        return len(self.doc_first) - 1

    def document(self, index: int) -> Sentence:
        """A document's tokens (a view)."""
        begin = self.starts[self.doc_first[index]]
        last = self.doc_first[index + 1] - 1
        end = self.starts[last] + self.lengths[last]
        return self.ids[begin:end], self.cont[begin:end]


@dataclass
class Instances:
    """Instances as spans of one flat token array: segment A is ``ids[a_start:a_start + a_len]``, B likewise
    (``b_len`` 0: no B), with whether B is a random next segment."""

    ids: np.ndarray
    cont: np.ndarray
    a_start: np.ndarray
    a_len: np.ndarray
    b_start: np.ndarray
    b_len: np.ndarray
    random_next: np.ndarray

    def __len__(self) -> int:
        return len(self.a_start)

    @staticmethod
    def join(parts: list[Instances]) -> Instances:
        """One batch of several; spans into different token arrays are moved onto one array."""
        if len(parts) == 1:
            return parts[0]
        shared = all(p.ids is parts[0].ids for p in parts)
        offsets = np.zeros(len(parts), dtype=np.int64) if shared \
            else np.concatenate(([0], np.cumsum([len(p.ids) for p in parts[:-1]])))
        ids = parts[0].ids if shared else np.concatenate([p.ids for p in parts])
        cont = parts[0].cont if shared else np.concatenate([p.cont for p in parts])
        joined = {f: np.concatenate([p.__dict__[f] + offset if f.endswith("start") else p.__dict__[f]
                                     for p, offset in zip(parts, offsets, strict=True)])
                  for f in ("a_start", "a_len", "b_start", "b_len", "random_next")}
        return Instances(ids, cont, **joined)


def pair_batches(block: TokenBlock, spec: InstanceSpec, rng: random.Random, passes: int, batch: int) -> list[Instances]:
    """Segment pairs of ``passes`` passes over the block's documents (Google's loop, :mod:`.pair_loop`), in
    batches of at least ``batch`` that each end with a document."""
    pairs, ends = segment_pairs(block.starts, block.lengths, block.doc_first, max_seq_length=spec.max_seq_length,
                                short_seq_prob=spec.short_seq_prob, nsp=spec.nsp, passes=passes, batch=batch, rng=rng)
    columns = [np.ascontiguousarray(pairs[:, k]) for k in range(4)] + [pairs[:, 4].astype(bool)]
    return [Instances(block.ids, block.cont, *(c[a:b] for c in columns))
            for a, b in zip(ends[:-1].tolist(), ends[1:].tolist(), strict=True)]


class SequencePacker:
    """Cuts a stream of documents into full sequences: ``[CLS] doc1 [SEP] doc2 ... [SEP]``, one segment.

    The stream goes on across calls (blocks of a shard, and passes over them); what does not fill a
    whole sequence waits for the next call, and :meth:`finish` returns it as the shard's last sequence.
    """

    def __init__(self, spec: InstanceSpec):
        self.capacity = spec.max_seq_length - 2  # [CLS] first, [SEP] last
        self.sep_id = spec.sep_id
        self.tail = (_EMPTY_IDS, _EMPTY_FLAGS)

    def pack(self, docs: list[Sentence]) -> Instances:
        """Full sequences from what is left over and then ``docs`` (each a document's tokens) in order; the rest
        is kept."""
        parts_ids, parts_cont = [self.tail[0]], [self.tail[1]]
        separator, no_flag = np.array([self.sep_id], dtype=np.int32), np.zeros(1, dtype=bool)
        length = len(self.tail[0])
        for doc_ids, doc_cont in docs:
            if length:  # a document that does not start a sequence follows a [SEP]
                parts_ids.append(separator)
                parts_cont.append(no_flag)
            parts_ids.append(doc_ids)
            parts_cont.append(doc_cont)
            length += 1 + len(doc_ids)
        ids, cont = np.concatenate(parts_ids), np.concatenate(parts_cont)
        # The last word start at or before each position: where a cut may fall without splitting a word.
        word_start = np.maximum.accumulate(np.where(cont, 0, np.arange(len(ids))))
        spans, start, n = [], 0, len(ids)
        while True:
            while start < n and ids[start] == self.sep_id:
                start += 1  # a sequence never starts with a document separator
            end = start + self.capacity
            if end > n:
                break
            if end < n and cont[end] and word_start[end] > start:
                end = word_start[end]  # the word that does not fit goes to the next sequence whole
            spans.append(self._span(ids, start, end))
            start = end
        self.tail = (ids[start:], cont[start:])
        return _single_segments(ids, cont, spans)

    def finish(self) -> Instances | None:
        """The last, partly filled sequence (if anything is left)."""
        ids, cont = self.tail
        self.tail = (_EMPTY_IDS, _EMPTY_FLAGS)
        if not np.count_nonzero(ids != self.sep_id):
            return None
        return _single_segments(ids, cont, [self._span(ids, 0, len(ids))])

    def _span(self, ids, start, end) -> tuple[int, int]:
        if end - start > 1 and ids[end - 1] == self.sep_id:
            end -= 1  # the closing [SEP] ends the sequence: no separator right before it
        return start, end - start


def _single_segments(ids: np.ndarray, cont: np.ndarray, spans: list[tuple[int, int]]) -> Instances:
    a = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
    none = np.zeros(len(a), dtype=np.int64)
    return Instances(ids, cont, a[:, 0], a[:, 1], none, none, np.zeros(len(a), dtype=bool))


def mask_batch(instances: Instances, spec: InstanceSpec, rng: np.random.Generator) -> tuple[dict[str, np.ndarray], int]:
    """Feature arrays of a batch of instances in the original BERT schema, masked, and how many real tokens
    (neither [CLS], [SEP] nor padding) they hold."""
    tokens, segment_ids, input_mask, real, cont = layout(
        instances.ids, instances.cont, instances.a_start, instances.a_len, instances.b_start, instances.b_len,
        spec.max_seq_length, spec.cls_id, spec.sep_id)
    selected = _select_masked(real, cont, spec, rng)
    masked_lm_positions, masked_lm_ids, masked_lm_weights = predictions(selected, tokens, spec.max_predictions_per_seq)
    rows, slots = np.nonzero(masked_lm_weights)  # row-major: the order of the selected tokens
    input_ids = tokens.copy()
    input_ids[rows, masked_lm_positions[rows, slots]] = _replacements(masked_lm_ids[rows, slots], spec, rng)
    features = {
        "input_ids": input_ids,
        "input_mask": input_mask,
        "segment_ids": segment_ids,
        "masked_lm_positions": masked_lm_positions,
        "masked_lm_ids": masked_lm_ids,
        "masked_lm_weights": masked_lm_weights,
        "next_sentence_labels": instances.random_next.astype(np.int32)[:, None],
    }
    return features, int(np.count_nonzero(real))


def _select_masked(real: np.ndarray, cont: np.ndarray, spec: InstanceSpec, rng: np.random.Generator) -> np.ndarray:
    """Which tokens are masked: candidate words in a random order (a key per word), taken greedily while they
    fit the budget of ``masked_lm_prob`` of the real tokens (at least 1, at most ``max_predictions_per_seq``)."""
    word_of, word_length, n_words = words(real, cont, spec.do_whole_word_mask)
    n_real = real.sum(axis=1)
    budgets = np.minimum(spec.max_predictions_per_seq,
                         np.maximum(1, np.round(n_real * spec.masked_lm_prob))).astype(np.int64)
    keys = rng.random((len(real), max(int(n_words.max()) if len(real) else 0, 1)))
    return greedy_selection(real, word_of, word_length, n_words, keys, budgets)


def _replacements(originals: np.ndarray, spec: InstanceSpec, rng: np.random.Generator) -> np.ndarray:
    """What each masked token becomes: 80% [MASK], 10% a random real token, 10% itself."""
    draw = rng.random(len(originals))
    replacement = originals.copy()
    replacement[draw < 0.8] = spec.mask_id
    randomised = draw >= 0.9
    replacement[randomised] = spec.replacement_ids[rng.integers(0, len(spec.replacement_ids), int(randomised.sum()))]
    return replacement
