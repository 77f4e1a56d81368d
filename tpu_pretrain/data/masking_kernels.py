"""The per-token work of laying out and masking a batch of instances, compiled (numba).

In NumPy these steps were whole-matrix passes (gathers, cumulative sums, a sort of every row's words and a
column-by-column greedy walk), together the largest share of create-data's time once the pair loop was
compiled. Here each row is one loop. The random draws stay in NumPy, made by the caller with the same
generator, shapes and order as before, so the shards are byte for byte what the NumPy code wrote.
"""

from __future__ import annotations

import numpy as np

from .compiled import njit


@njit()
def layout(ids, cont, a_start, a_len, b_start, b_len, length, cls_id, sep_id):
    """``[CLS] A [SEP] (B [SEP])`` per row: token ids, segment ids, input mask, which tokens are real (not
    [CLS], [SEP], a packed document's separator or padding) and which continue a word."""
    n = len(a_start)
    tokens = np.zeros((n, length), dtype=np.int32)
    segment_ids = np.zeros((n, length), dtype=np.int32)
    input_mask = np.zeros((n, length), dtype=np.int32)
    real = np.zeros((n, length), dtype=np.bool_)
    continues = np.zeros((n, length), dtype=np.bool_)
    for row in range(n):
        tokens[row, 0] = cls_id
        for k in range(a_len[row]):
            token = ids[a_start[row] + k]
            tokens[row, 1 + k] = token
            real[row, 1 + k] = token != sep_id
            continues[row, 1 + k] = cont[a_start[row] + k]
        end = 1 + a_len[row]
        tokens[row, end] = sep_id
        if b_len[row] > 0:
            for k in range(b_len[row]):
                col = end + 1 + k
                tokens[row, col] = ids[b_start[row] + k]
                real[row, col] = True
                continues[row, col] = cont[b_start[row] + k]
                segment_ids[row, col] = 1
            end += 1 + b_len[row]
            tokens[row, end] = sep_id
            segment_ids[row, end] = 1
        input_mask[row, :end + 1] = 1
    return tokens, segment_ids, input_mask, real, continues


@njit()
def words(real, continues, whole_word):
    """Each real token's word (a token starts one unless, in whole-word mode, it continues a real previous
    token), each word's length in tokens, and each row's number of words."""
    n, length = real.shape
    word_of = np.full((n, length), -1, dtype=np.int64)
    word_length = np.zeros((n, length), dtype=np.int64)
    n_words = np.zeros(n, dtype=np.int64)
    for row in range(n):
        word = -1
        for col in range(length):
            if not real[row, col]:
                continue
            if not (whole_word and continues[row, col] and col > 0 and real[row, col - 1]):
                word += 1
            word_of[row, col] = word
            word_length[row, word] += 1
        n_words[row] = word + 1
    return word_of, word_length, n_words


@njit()
def greedy_selection(real, word_of, word_length, n_words, keys, budgets):
    """Which tokens are masked: each row's words in the order of their random ``keys`` (ascending), each taken
    while it still fits the row's budget of tokens. The walk stops once the budget is full (no word is empty),
    so a row costs a few passes over its words rather than a sort."""
    n, length = real.shape
    selected = np.zeros((n, length), dtype=np.bool_)
    chosen = np.zeros(length + 1, dtype=np.bool_)
    visited = np.zeros(length + 1, dtype=np.bool_)
    for row in range(n):
        count = n_words[row]
        chosen[:count] = False
        visited[:count] = False
        taken = 0
        for _ in range(count):
            if taken >= budgets[row]:
                break
            word, smallest = -1, 2.0
            for candidate in range(count):
                if not visited[candidate] and keys[row, candidate] < smallest:
                    word, smallest = candidate, keys[row, candidate]
            visited[word] = True
            if taken + word_length[row, word] <= budgets[row]:
                chosen[word] = True
                taken += word_length[row, word]
        for col in range(length):
            if real[row, col] and chosen[word_of[row, col]]:
                selected[row, col] = True
    return selected


@njit()
def predictions(selected, tokens, max_predictions):
    """The masked positions of each row in ascending order, the tokens there, and 1.0 weights, padded to
    ``max_predictions`` (the original BERT schema's ``masked_lm_*`` features)."""
    n, length = selected.shape
    positions = np.zeros((n, max_predictions), dtype=np.int32)
    originals = np.zeros((n, max_predictions), dtype=np.int32)
    weights = np.zeros((n, max_predictions), dtype=np.float32)
    for row in range(n):
        k = 0
        for col in range(length):
            if selected[row, col]:
                positions[row, k] = col
                originals[row, k] = tokens[row, col]
                weights[row, k] = 1.0
                k += 1
    return positions, originals, weights
