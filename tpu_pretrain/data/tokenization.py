"""BERT's basic + WordPiece tokenisation, fast: Hugging Face ``tokenizers``, with ASCII words compiled.

The same algorithm as Google's ``FullTokenizer`` (clean text, CJK characters split, optional
lower-casing and accent stripping, punctuation split, greedy longest-match WordPiece with ``##``
continuations, words over 100 characters become [UNK]), built in ``tokenizers``; batches go through
:mod:`.wordpiece_kernel`, which hands it only the words that are not printable ASCII.
"""

from __future__ import annotations

import functools

import numpy as np

from .tokenizer_json import TokenizerJson
from .vocab import Vocab, load_vocab
from .vocab_tokenizer import VocabTokenizer

MAX_INPUT_CHARS_PER_WORD = 100


class BertTokenizer(VocabTokenizer):
    """A WordPiece tokenizer with the same vocab and rules as Google's ``FullTokenizer``."""

    def __init__(self, vocab_file: str, do_lower_case: bool = True):
        from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

        self.vocab_file = str(vocab_file)
        self.do_lower_case = do_lower_case
        self.inv_vocab = load_vocab(vocab_file)
        self.vocab = {token: index for index, token in enumerate(self.inv_vocab)}
        tokenizer = Tokenizer(
            models.WordPiece(vocab=self.vocab, unk_token="[UNK]", max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD)
        )
        tokenizer.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=do_lower_case, lowercase=do_lower_case
        )
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece(prefix="##")
        self._tokenizer = tokenizer
        self._name_special_ids()
        self.is_continuation = np.array([t.startswith("##") for t in self.inv_vocab], dtype=bool)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids of many texts at once, as int32 arrays: words of printable ASCII through the compiled
        :mod:`.wordpiece_kernel` (the same ids in a fraction of the time), any others through ``tokenizers``."""
        return self._wordpiece_table.encode(texts, self._encode_in_rust) if texts else []

    def _encode_in_rust(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tokenizer.encode_batch_fast(texts, add_special_tokens=False)]

    @functools.cached_property
    def _wordpiece_table(self):
        from .wordpiece_kernel import WordPieceTable

        return WordPieceTable(self.vocab, self.unk_id, self.do_lower_case, MAX_INPUT_CHARS_PER_WORD)

    def word_continuations(self, ids: np.ndarray) -> np.ndarray:
        """Per token of a sentence: whether it continues the previous token's word (whole-word masking)."""
        return self.is_continuation[ids]

    def join_pieces(self, tokens: list[str]) -> str:
        """One word from its WordPieces, as text (fill-mask's candidates)."""
        return "".join(t[2:] if t.startswith("##") else t for t in tokens)


def load_tokenizer(vocab: Vocab | str, do_lower_case: bool = True) -> VocabTokenizer:
    """The project's tokenizer for a vocab (or a ``vocab_file`` setting): a vocab.txt's ``tokenize``/``encode``
    match Google's FullTokenizer; a tokenizer.json (or a model folder holding one) is that file's own tokenizer."""
    vocab = vocab if isinstance(vocab, Vocab) else Vocab.read(vocab)
    if vocab.is_tokenizer_json:
        return TokenizerJson(vocab.source)
    return BertTokenizer(str(vocab.source), do_lower_case=do_lower_case)
