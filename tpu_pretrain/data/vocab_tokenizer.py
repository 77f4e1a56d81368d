"""The interface every vocab's tokenizer offers (a WordPiece vocab.txt's, a tokenizer.json's), built on its Hugging
Face ``tokenizers.Tokenizer``: one place for what the two share."""

from __future__ import annotations

import numpy as np

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # what pretraining needs, by name, at any ids


class VocabTokenizer:
    """What the tokenizer of any vocab offers, from its ``tokenizers.Tokenizer`` (``_tokenizer``), its tokens in id
    order (``inv_vocab``) and their ids (``vocab``, holding every one of ``SPECIAL_TOKENS``)."""

    def _name_special_ids(self) -> None:
        """``special_ids`` and ``pad_id`` ... ``mask_id``, from ``vocab``."""
        self.special_ids = {token: self.vocab[token] for token in SPECIAL_TOKENS}
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (self.special_ids[t] for t in SPECIAL_TOKENS)

    @property
    def vocab_size(self) -> int:
        return len(self.inv_vocab)

    @property
    def backend(self):
        """The underlying ``tokenizers.Tokenizer`` (for offsets and batch work)."""
        return self._tokenizer

    def tokenize(self, text: str) -> list[str]:
        return self._tokenizer.encode(text, add_special_tokens=False).tokens

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids of many texts at once (parallel in Rust), as int32 arrays."""
        return [np.asarray(e.ids, dtype=np.int32)
                for e in self._tokenizer.encode_batch_fast(texts, add_special_tokens=False)]

    def convert_tokens_to_ids(self, tokens: list[str]) -> list[int]:
        return [self.vocab.get(t, self.unk_id) for t in tokens]

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [self.inv_vocab[int(i)] for i in ids]

    def decode(self, ids) -> str:
        return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)
