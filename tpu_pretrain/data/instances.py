"""BERT pretraining instances: Google's algorithm, with the masking vectorised over batches.

Segments follow ``create_instances_from_document`` of the original ``create_pretraining_data.py``:
a target length (shorter with ``short_seq_prob``), sentences gathered into a chunk, a random split
into A and B, B replaced by a span of another document half the time (always when the chunk holds
one sentence), the longer segment truncated from a random end. Masking follows
``create_masked_lm_predictions``: candidates are words (or WordPieces), shuffled, taken greedily
while they fit the budget, each masked token 80% [MASK], 10% random, 10% unchanged. The per-token
work of masking runs in NumPy over a whole batch, which is what makes this fast.

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


@dataclass
class RawInstance:
    tokens_a: np.ndarray
    tokens_b: np.ndarray
    cont_a: np.ndarray
    cont_b: np.ndarray
    is_random_next: bool


def document_instances(docs: list[list[Sentence]], doc_index: int, spec: InstanceSpec,
                       rng: random.Random) -> list[RawInstance]:
    """Segment pairs from one document, as Google's ``create_instances_from_document`` makes them."""
    document = docs[doc_index]
    max_num_tokens = spec.max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < spec.short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    instances = []
    chunk: list[Sentence] = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        chunk.append(segment)
        current_length += len(segment[0])
        if i == len(document) - 1 or current_length >= target_seq_length:
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            part_a = chunk[:a_end]
            is_random_next = False
            if spec.nsp and len(docs) > 1 and (len(chunk) == 1 or rng.random() < 0.5):
                is_random_next = True
                target_b_length = target_seq_length - sum(len(s[0]) for s in part_a)
                for _ in range(10):
                    random_index = rng.randint(0, len(docs) - 1)
                    if random_index != doc_index:
                        break
                random_document = docs[random_index]
                part_b = []
                length_b = 0
                for j in range(rng.randint(0, len(random_document) - 1), len(random_document)):
                    part_b.append(random_document[j])
                    length_b += len(random_document[j][0])
                    if length_b >= target_b_length:
                        break
                i -= len(chunk) - a_end  # the unused sentences are put back
            else:
                part_b = chunk[a_end:]
            instance = _make_pair(part_a, part_b, is_random_next, max_num_tokens, rng)
            if instance is not None and (len(instance.tokens_b) or not spec.nsp):
                instances.append(instance)
            chunk = []
            current_length = 0
        i += 1
    return instances


_EMPTY_IDS = np.zeros(0, dtype=np.int32)
_EMPTY_FLAGS = np.zeros(0, dtype=bool)


def _concat(part: list[Sentence]) -> tuple[np.ndarray, np.ndarray]:
    if not part:
        return _EMPTY_IDS, _EMPTY_FLAGS
    if len(part) == 1:
        return part[0]
    return np.concatenate([s[0] for s in part]), np.concatenate([s[1] for s in part])


def _make_pair(part_a, part_b, is_random_next, max_num_tokens, rng) -> RawInstance | None:
    ids_a, cont_a = _concat(part_a)
    ids_b, cont_b = _concat(part_b)
    la, lb = len(ids_a), len(ids_b)
    cut_a, cut_b = truncation_counts(la, lb, max_num_tokens)
    if cut_a:
        front = bin(rng.getrandbits(cut_a)).count("1")  # each removal from the front with p=0.5
        ids_a, cont_a = ids_a[front:la - cut_a + front], cont_a[front:la - cut_a + front]
    if cut_b:
        front = bin(rng.getrandbits(cut_b)).count("1")
        ids_b, cont_b = ids_b[front:lb - cut_b + front], cont_b[front:lb - cut_b + front]
    if len(ids_a) < 1:
        return None
    return RawInstance(ids_a, ids_b, cont_a, cont_b, is_random_next)


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

    def pack(self, docs: list[list[Sentence]]) -> list[RawInstance]:
        """Full sequences from what is left over and then ``docs`` in order; the rest is kept."""
        parts_ids, parts_cont = [self.tail[0]], [self.tail[1]]
        separator, no_flag = np.array([self.sep_id], dtype=np.int32), np.zeros(1, dtype=bool)
        length = len(self.tail[0])
        for doc in docs:
            if length:  # a document that does not start a sequence follows a [SEP]
                parts_ids.append(separator)
                parts_cont.append(no_flag)
            parts_ids.extend(s[0] for s in doc)
            parts_cont.extend(s[1] for s in doc)
            length += 1 + sum(len(s[0]) for s in doc)
        ids, cont = np.concatenate(parts_ids), np.concatenate(parts_cont)
        # The last word start at or before each position: where a cut may fall without splitting a word.
        word_start = np.maximum.accumulate(np.where(cont, 0, np.arange(len(ids))))
        instances, start, n = [], 0, len(ids)
        while True:
            while start < n and ids[start] == self.sep_id:
                start += 1  # a sequence never starts with a document separator
            end = start + self.capacity
            if end > n:
                break
            if end < n and cont[end] and word_start[end] > start:
                end = word_start[end]  # the word that does not fit goes to the next sequence whole
            instances.append(self._instance(ids, cont, start, end))
            start = end
        self.tail = (ids[start:], cont[start:])
        return instances

    def finish(self) -> list[RawInstance]:
        """The last, partly filled sequence (if anything is left)."""
        ids, cont = self.tail
        self.tail = (_EMPTY_IDS, _EMPTY_FLAGS)
        if not np.count_nonzero(ids != self.sep_id):
            return []
        return [self._instance(ids, cont, 0, len(ids))]

    def _instance(self, ids, cont, start, end) -> RawInstance:
        if end - start > 1 and ids[end - 1] == self.sep_id:
            end -= 1  # the closing [SEP] ends the sequence: no separator right before it
        return RawInstance(ids[start:end], _EMPTY_IDS, cont[start:end], _EMPTY_FLAGS, False)


def mask_batch(instances: list[RawInstance], spec: InstanceSpec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Feature arrays of a batch of instances in the original BERT schema, masked."""
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
    return {
        "input_ids": input_ids,
        "input_mask": input_mask,
        "segment_ids": segment_ids,
        "masked_lm_positions": masked_lm_positions,
        "masked_lm_ids": masked_lm_ids,
        "masked_lm_weights": masked_lm_weights,
        "next_sentence_labels": np.array([[int(i.is_random_next)] for i in instances], dtype=np.int32),
    }


def _layout(instances: list[RawInstance], spec: InstanceSpec):
    """[CLS] A [SEP] (B [SEP]) per row: token ids, segment ids, which tokens are real, which continue a
    word, and each row's length."""
    n, length = len(instances), spec.max_seq_length
    tokens = np.zeros((n, length), dtype=np.int32)
    segment_ids = np.zeros((n, length), dtype=np.int32)
    real = np.zeros((n, length), dtype=bool)
    cont = np.zeros((n, length), dtype=bool)
    lengths = np.zeros(n, dtype=np.int64)
    for row, inst in enumerate(instances):
        la, lb = len(inst.tokens_a), len(inst.tokens_b)
        tokens[row, 0] = spec.cls_id
        tokens[row, 1:1 + la] = inst.tokens_a
        tokens[row, 1 + la] = spec.sep_id
        real[row, 1:1 + la] = inst.tokens_a != spec.sep_id  # packed documents' separators are not masked
        cont[row, 1:1 + la] = inst.cont_a
        total = 2 + la
        if lb:
            tokens[row, total:total + lb] = inst.tokens_b
            real[row, total:total + lb] = True
            cont[row, total:total + lb] = inst.cont_b
            tokens[row, total + lb] = spec.sep_id
            segment_ids[row, total:total + lb + 1] = 1
            total += lb + 1
        lengths[row] = total
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
    keys[np.arange(width)[None, :] >= n_words[:, None]] = 2.0
    order = np.argsort(keys, axis=1)
    chosen = np.zeros((n, width), dtype=bool)
    taken = np.zeros(n, dtype=np.int64)
    row_index = np.arange(n)
    for t in range(width):
        word = order[:, t]
        wl = word_len[row_index, word]
        fits = (t < n_words) & (taken + wl <= budget)
        chosen[row_index, word] = fits
        taken += wl * fits
        if t % 8 == 7 and np.all((taken >= budget) | (t + 1 >= n_words)):
            break
    return real & chosen[rows, np.maximum(word_of, 0)]


def _replacements(originals: np.ndarray, spec: InstanceSpec, rng: np.random.Generator) -> np.ndarray:
    """What each masked token becomes: 80% [MASK], 10% a random real token, 10% itself."""
    draw = rng.random(len(originals))
    replacement = originals.copy()
    replacement[draw < 0.8] = spec.mask_id
    randomised = draw >= 0.9
    replacement[randomised] = spec.replacement_ids[rng.integers(0, len(spec.replacement_ids), int(randomised.sum()))]
    return replacement
