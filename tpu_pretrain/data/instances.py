"""BERT pretraining instances: Google's algorithm, with the masking vectorised over batches.

Segments follow ``create_instances_from_document`` of the original ``create_pretraining_data.py``:
a target length (shorter with ``short_seq_prob``), sentences gathered into a chunk, a random split
into A and B, B replaced by a span of another document half the time (always when the chunk holds
one sentence), the longer segment truncated from a random end. Masking follows
``create_masked_lm_predictions``: candidates are words (or WordPieces), shuffled, taken greedily
while they fit the budget, each masked token 80% [MASK], 10% random, 10% unchanged.

What makes this fast is that no per-instance work touches tokens in Python: a block's documents are one flat
token array (:class:`TokenBlock`), so an instance is four numbers, the spans of its segments A and B
(:class:`Instances`); Google's loop decides the spans on sentence lengths alone, and laying the instances out,
masking and encoding them runs in NumPy over a whole batch at once.

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
        lengths = [len(s[0]) for s in sentences]
        starts = np.concatenate(([0], np.cumsum(lengths[:-1], dtype=np.int64))).tolist() if lengths else []
        self.starts: list[list[int]] = []  # per document, its sentences' starts in ids
        self.lengths: list[list[int]] = []
        k = 0
        for doc in docs:
            self.starts.append(starts[k:k + len(doc)])
            self.lengths.append(lengths[k:k + len(doc)])
            k += len(doc)

    def __len__(self) -> int:
        return len(self.starts)

    def document(self, index: int) -> Sentence:
        """A document's tokens (a view)."""
        begin = self.starts[index][0]
        end = self.starts[index][-1] + self.lengths[index][-1]
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


class PairMaker:
    """Segment pairs of a :class:`TokenBlock`'s documents, as Google's ``create_instances_from_document`` makes
    them, gathered as spans (:meth:`take` hands over what was made)."""

    def __init__(self, block: TokenBlock, spec: InstanceSpec):
        self.block, self.spec = block, spec
        self.spans: list[tuple[int, int, int, int, bool]] = []

    def __len__(self) -> int:
        return len(self.spans)

    def take(self) -> Instances:
        spans = np.asarray(self.spans, dtype=np.int64).reshape(-1, 5)
        self.spans = []
        return Instances(self.block.ids, self.block.cont, spans[:, 0], spans[:, 1], spans[:, 2], spans[:, 3],
                         spans[:, 4].astype(bool))

    def add_document(self, doc_index: int, rng: random.Random) -> None:
        """Segment pairs from one document (Google's loop, on sentence lengths and offsets).

        ``below(n)`` is what ``rng.randint(low, low + n - 1) - low`` computes, the same draw without randint's two
        layers of argument checks (a third of this loop's time on short documents).
        """
        spec, block, below = self.spec, self.block, rng._randbelow
        starts, lengths = block.starts[doc_index], block.lengths[doc_index]
        n, n_docs = len(lengths), len(block)
        max_num_tokens = spec.max_seq_length - 3
        target_seq_length = max_num_tokens
        if rng.random() < spec.short_seq_prob:
            target_seq_length = 2 + below(max_num_tokens - 1)
        first = current_length = i = 0  # the chunk is sentences first..i
        while i < n:
            current_length += lengths[i]
            if i == n - 1 or current_length >= target_seq_length:
                size = i - first + 1
                a_end = 1 + below(size - 1) if size >= 2 else 1
                a_start = starts[first]
                a_len = starts[first + a_end - 1] + lengths[first + a_end - 1] - a_start
                if spec.nsp and n_docs > 1 and (size == 1 or rng.random() < 0.5):
                    b_start, b_len = self._random_segment(doc_index, target_seq_length - a_len, rng)
                    i -= size - a_end  # the unused sentences are put back
                    self._pair(a_start, a_len, b_start, b_len, True, max_num_tokens, rng)
                else:
                    b_start = a_start + a_len
                    self._pair(a_start, a_len, b_start, starts[i] + lengths[i] - b_start, False, max_num_tokens, rng)
                first, current_length = i + 1, 0
            i += 1

    def _random_segment(self, doc_index: int, target_b_length: int, rng: random.Random) -> tuple[int, int]:
        """Sentences from a random point of another document until they reach the target length."""
        below = rng._randbelow  # as in add_document
        for _ in range(10):
            random_index = below(len(self.block))
            if random_index != doc_index:
                break
        starts, lengths = self.block.starts[random_index], self.block.lengths[random_index]
        j = below(len(lengths))
        length_b = 0
        for length in lengths[j:]:
            length_b += length
            if length_b >= target_b_length:
                break
        return starts[j], length_b

    def _pair(self, a_start, a_len, b_start, b_len, is_random_next, max_num_tokens, rng) -> None:
        cut_a, cut_b = truncation_counts(a_len, b_len, max_num_tokens)
        if cut_a:  # each removal from the front with p=0.5
            a_start += bin(rng.getrandbits(cut_a)).count("1")
            a_len -= cut_a
        if cut_b:
            b_start += bin(rng.getrandbits(cut_b)).count("1")
            b_len -= cut_b
        if a_len >= 1 and (b_len or not self.spec.nsp):
            self.spans.append((a_start, a_len, b_start, b_len, is_random_next))


def truncation_counts(len_a: int, len_b: int, max_num_tokens: int) -> tuple[int, int]:
    """Tokens Google's ``truncate_seq_pair`` removes from A and B (it always trims the longer; B on ties)."""
    excess = len_a + len_b - max_num_tokens
    if excess <= 0:
        return 0, 0
    if len_a > len_b:
        cut_a = min(excess, len_a - len_b)
        rest = excess - cut_a
        return cut_a + rest // 2, (rest + 1) // 2
    cut_b = min(excess, len_b - len_a)
    rest = excess - cut_b
    return rest // 2, cut_b + (rest + 1) // 2


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
    tokens, segment_ids, real, cont, lengths = _layout(instances, spec)
    input_mask = (np.arange(spec.max_seq_length)[None, :] < lengths[:, None]).astype(np.int32)
    selected = _select_masked(real, cont, spec, rng)
    n, max_pred = len(instances), spec.max_predictions_per_seq
    sel_rows, sel_cols = np.nonzero(selected)  # row-major: positions ascending within each row
    rank = (np.cumsum(selected, axis=1) - 1)[sel_rows, sel_cols]
    originals = tokens[sel_rows, sel_cols]
    input_ids = tokens.copy()
    input_ids[sel_rows, sel_cols] = _replacements(originals, spec, rng)

    masked_lm_positions = np.zeros((n, max_pred), dtype=np.int32)
    masked_lm_ids = np.zeros((n, max_pred), dtype=np.int32)
    masked_lm_weights = np.zeros((n, max_pred), dtype=np.float32)
    masked_lm_positions[sel_rows, rank] = sel_cols
    masked_lm_ids[sel_rows, rank] = originals
    masked_lm_weights[sel_rows, rank] = 1.0
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


def _layout(inst: Instances, spec: InstanceSpec):
    """[CLS] A [SEP] (B [SEP]) per row, gathered from the spans at once: token ids, segment ids, which tokens are
    real, which continue a word, and each row's length."""
    col = np.arange(spec.max_seq_length)[None, :]
    a_len, b_len = inst.a_len[:, None], inst.b_len[:, None]
    b_first = a_len + 2
    in_a = (col >= 1) & (col <= a_len)
    in_b = (col >= b_first) & (col < b_first + b_len)
    source = np.where(in_a, inst.a_start[:, None] + col - 1, np.where(in_b, inst.b_start[:, None] + col - b_first, 0))
    inside = in_a | in_b
    gathered = inst.ids[source] if len(inst.ids) else np.zeros(source.shape, dtype=np.int32)
    tokens = np.where(inside, gathered, 0).astype(np.int32)
    cont = inside & (inst.cont[source] if len(inst.cont) else False)
    real = (in_a & (tokens != spec.sep_id)) | in_b  # packed documents' separators are not masked
    rows = np.arange(len(inst))
    has_b = inst.b_len > 0
    tokens[:, 0] = spec.cls_id
    tokens[rows, 1 + inst.a_len] = spec.sep_id
    tokens[rows[has_b], (b_first[:, 0] + inst.b_len)[has_b]] = spec.sep_id
    segment_ids = (has_b[:, None] & (col >= b_first) & (col <= b_first + b_len)).astype(np.int32)
    lengths = 2 + inst.a_len + np.where(has_b, inst.b_len + 1, 0)
    return tokens, segment_ids, real, cont, lengths


def _select_masked(real: np.ndarray, cont: np.ndarray, spec: InstanceSpec, rng: np.random.Generator) -> np.ndarray:
    """Which tokens are masked: candidate words in a random order, taken greedily while they fit the budget."""
    n, length = real.shape
    # Candidate words: a token starts a word unless (whole-word mode) it continues a real previous token.
    prev_real = np.zeros_like(real)
    prev_real[:, 1:] = real[:, :-1]
    starts = real & ~(cont & prev_real) if spec.do_whole_word_mask else real
    word_of = np.cumsum(starts, axis=1) - 1
    n_words = starts.sum(axis=1)
    width = max(int(n_words.max()), 1)
    rows = np.broadcast_to(np.arange(n)[:, None], (n, length))
    word_len = np.bincount((rows * width + np.where(real, word_of, 0))[real], minlength=n * width).reshape(n, width)
    n_real = real.sum(axis=1)
    budget = np.minimum(spec.max_predictions_per_seq,
                        np.maximum(1, np.round(n_real * spec.masked_lm_prob))).astype(np.int64)

    keys = rng.random((n, width))
    valid = np.arange(width)[None, :] < n_words[:, None]
    keys[~valid] = 2.0
    order = np.argsort(keys, axis=1)
    ordered_len = np.take_along_axis(word_len, order, axis=1)
    # Greedy in the random order: every word fits until the budget is first overrun (one cumulative sum finds
    # where, for all rows at once); only after that may a later, shorter word still fit, which the loop decides.
    fitting = np.cumsum(np.where(valid, ordered_len, 0), axis=1) <= budget[:, None]
    taken_in_order = np.logical_and.accumulate(fitting | ~valid, axis=1) & valid
    taken = (ordered_len * taken_in_order).sum(axis=1)
    settled = taken_in_order | ~valid
    first_overrun = int(np.where(settled.all(axis=1), width, np.argmin(settled, axis=1)).min()) if n else width
    row_index = np.arange(n)
    for t in range(first_overrun, width):
        fits = valid[:, t] & ~taken_in_order[:, t] & (taken + ordered_len[:, t] <= budget)
        taken_in_order[:, t] |= fits
        taken += ordered_len[:, t] * fits
        if t % 8 == 7 and np.all((taken >= budget) | (t + 1 >= n_words)):
            break
    chosen = np.zeros((n, width), dtype=bool)
    chosen[row_index[:, None], order] = taken_in_order
    return real & chosen[rows, np.maximum(word_of, 0)]


def _replacements(originals: np.ndarray, spec: InstanceSpec, rng: np.random.Generator) -> np.ndarray:
    """What each masked token becomes: 80% [MASK], 10% a random real token, 10% itself."""
    draw = rng.random(len(originals))
    replacement = originals.copy()
    replacement[draw < 0.8] = spec.mask_id
    randomised = draw >= 0.9
    replacement[randomised] = spec.replacement_ids[rng.integers(0, len(spec.replacement_ids), int(randomised.sum()))]
    return replacement
