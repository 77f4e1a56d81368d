"""Google's segment-pair loop over a block's documents, compiled (numba), drawing from the caller's ``random.Random``.

``create_instances_from_document`` decides each instance from sentence lengths alone: a target length (shorter
with ``short_seq_prob``), sentences gathered into a chunk, a random split into A and B, B replaced by a span of
another document half the time (always when the chunk holds one sentence), the longer segment truncated from a
random end. Run in Python it is an interpreted iteration per sentence, most of create-data's time on short
documents; here it runs over every document of every pass at once, making the same draws in the same order
(:mod:`.python_random`), so the pairs, and the shards, are what the Python loop made.
"""

from __future__ import annotations

import random

import numpy as np

from .compiled import njit
from .python_random import below, export_state, import_state, ones_in_bits, uniform


@njit()
def truncation_counts(len_a, len_b, max_num_tokens):
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


@njit()
def _pairs(starts, lengths, doc_first, max_num_tokens, short_seq_prob, nsp, passes, batch, state):
    n_docs = len(doc_first) - 1
    out = np.zeros((passes * len(lengths) + 1, 5), dtype=np.int64)  # a chunk uses at least one sentence
    batch_ends = [0]
    made = 0
    for _ in range(passes):
        for doc in range(n_docs):
            first_sentence, n = doc_first[doc], doc_first[doc + 1] - doc_first[doc]
            target = max_num_tokens
            if uniform(state) < short_seq_prob:
                target = 2 + below(state, max_num_tokens - 1)
            first = current = i = 0  # the chunk is sentences first..i
            while i < n:
                current += lengths[first_sentence + i]
                if i == n - 1 or current >= target:
                    size = i - first + 1
                    a_end = 1 + below(state, size - 1) if size >= 2 else 1
                    a_start = starts[first_sentence + first]
                    last_a = first_sentence + first + a_end - 1
                    a_len = starts[last_a] + lengths[last_a] - a_start
                    random_next = nsp and n_docs > 1 and (size == 1 or uniform(state) < 0.5)
                    if random_next:  # sentences from a random point of another document up to the target length
                        other = doc
                        for _ in range(10):
                            other = below(state, n_docs)
                            if other != doc:
                                break
                        other_first = doc_first[other]
                        j = below(state, doc_first[other + 1] - other_first)
                        b_start, b_len = starts[other_first + j], 0
                        for k in range(other_first + j, doc_first[other + 1]):
                            b_len += lengths[k]
                            if b_len >= target - a_len:
                                break
                        i -= size - a_end  # the unused sentences are put back
                    else:
                        b_start = a_start + a_len
                        b_len = starts[first_sentence + i] + lengths[first_sentence + i] - b_start
                    cut_a, cut_b = truncation_counts(a_len, b_len, max_num_tokens)
                    if cut_a:  # each removal from the front with p=0.5
                        a_start += ones_in_bits(state, cut_a)
                        a_len -= cut_a
                    if cut_b:
                        b_start += ones_in_bits(state, cut_b)
                        b_len -= cut_b
                    if a_len >= 1 and (b_len > 0 or not nsp):
                        out[made, 0], out[made, 1], out[made, 2], out[made, 3] = a_start, a_len, b_start, b_len
                        out[made, 4] = random_next
                        made += 1
                    first, current = i + 1, 0
                i += 1
            if made - batch_ends[-1] >= batch:  # batches end with a document
                batch_ends.append(made)
    if made > batch_ends[-1]:
        batch_ends.append(made)
    return out[:made], np.array(batch_ends, dtype=np.int64)


def segment_pairs(starts: np.ndarray, lengths: np.ndarray, doc_first: np.ndarray, *, max_seq_length: int,
                  short_seq_prob: float, nsp: bool, passes: int, batch: int, rng: random.Random):
    """``passes`` passes of Google's loop over the documents (document ``d``'s sentences are
    ``doc_first[d]:doc_first[d + 1]``, each ``lengths[s]`` tokens from ``starts[s]`` of the flat token array).

    Returns the pairs as an ``(n, 5)`` array of (A start, A length, B start, B length, random next), and where
    batches of at least ``batch`` pairs end (each at the end of a document; the last holds the rest). ``rng``
    is advanced by exactly the draws the Python loop makes.
    """
    state = export_state(rng)
    pairs, batch_ends = _pairs(np.asarray(starts, np.int64), np.asarray(lengths, np.int64),
                               np.asarray(doc_first, np.int64), max_seq_length - 3, float(short_seq_prob), bool(nsp),
                               int(passes), int(batch), state)
    import_state(rng, state)
    return pairs, batch_ends
