"""Draws of a ``random.Random`` made in compiled code (numba), continuing the very same stream.

Google's pair loop decides every instance with Python's Mersenne Twister (``random()``, ``randint``, bits for
truncation). Run as Python it is one interpreted iteration per sentence; compiled, it must draw exactly what
Python would, or the shards would change. :func:`export_state` hands a ``random.Random``'s state to compiled
code as an array, these functions draw from it as CPython's ``_randommodule.c`` and ``random.py`` do, and
:func:`import_state` puts the advanced state back, so Python code drawing after it sees the same numbers as if
it had drawn everything itself.
"""

from __future__ import annotations

import random

import numpy as np

from .compiled import njit

_N, _M = 624, 397
_POSITION = _N  # the state array holds the 624 words, then the index of the next one


def export_state(rng: random.Random) -> np.ndarray:
    version, internal, gauss_next = rng.getstate()
    if version != 3 or len(internal) != _N + 1 or gauss_next is not None:
        raise ValueError("unexpected random.Random state (not CPython's Mersenne Twister, or a pending gauss draw)")
    return np.array(internal, dtype=np.int64)


def import_state(rng: random.Random, state: np.ndarray) -> None:
    rng.setstate((3, tuple(int(word) for word in state), None))


@njit()
def next_word(state):
    """The next 32-bit output (CPython's ``genrand_uint32``)."""
    position = state[_POSITION]
    if position >= _N:
        for k in range(_N):
            y = (state[k] & 0x80000000) | (state[(k + 1) % _N] & 0x7FFFFFFF)
            word = state[(k + _M) % _N] ^ (y >> 1)
            if y & 1:
                word ^= 0x9908B0DF
            state[k] = word
        position = 0
    y = state[position]
    state[_POSITION] = position + 1
    y ^= y >> 11
    y ^= (y << 7) & 0x9D2C5680
    y ^= (y << 15) & 0xEFC60000
    return y ^ (y >> 18)


@njit()
def uniform(state):
    """``random.random()``: 53 random bits as a float in [0, 1)."""
    high = next_word(state) >> 5
    low = next_word(state) >> 6
    return (high * 67108864.0 + low) * (1.0 / 9007199254740992.0)


@njit()
def below(state, n):
    """``random._randbelow(n)`` for ``0 < n < 2**32``: ``randint(low, low + n - 1) - low`` draws the same."""
    bits = 0
    while (n >> bits) > 0:
        bits += 1
    value = next_word(state) >> (32 - bits)
    while value >= n:
        value = next_word(state) >> (32 - bits)
    return value


@njit()
def ones_in_bits(state, k):
    """How many ones ``random.getrandbits(k)`` holds (its 32-bit words are drawn low word first; the last
    word keeps its high bits)."""
    ones = 0
    while k > 0:
        word = next_word(state)
        if k < 32:
            word >>= 32 - k
        while word:
            word &= word - 1
            ones += 1
        k -= 32
    return ones


@njit()
def _shuffle_order(n, state):
    order = np.arange(n)
    for i in range(n - 1, 0, -1):
        j = below(state, i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def shuffled_order(n: int, rng: random.Random) -> np.ndarray:
    """The order ``rng.shuffle`` puts a list of ``n`` items in, ``rng`` advanced as that shuffle advances it."""
    state = export_state(rng)
    order = _shuffle_order(n, state)
    import_state(rng, state)
    return order
