"""The compiled side of a shard's work: tokenising, pairing, masking and encoding blocks of documents.

Only the processes that write shards import it (numba and the compiled code take a third of a second to load):
the parent dealing the corpus into work files does not wait for them.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Iterator

import numpy as np

from .data_folder import TRAIN, ShardStats
from .example_encoder import encode_framed, reordered
from .instances import Instances, InstanceSpec, Sentence, SequencePacker, TokenBlock, mask_batch, pair_batches
from .python_random import shuffled_order
from .vocab import replacement_ids
from .wordpiece_kernel import WordPieceTable

BATCH = 1024  # instances masked and encoded at a time


def load_compiled_code() -> None:
    """Load the compiled tokenising, pair, masking and encoding code (numba's cache; compiled on a machine's first
    run) by running it once on a toy block, so a worker pays for it while the parent still partitions the corpus."""
    WordPieceTable({"a": 0}, unk_id=0, lower_case=True, max_word_chars=100).encode(["a é"], lambda texts: [[0]])
    spec = InstanceSpec(max_seq_length=16, max_predictions_per_seq=2, masked_lm_prob=0.15, short_seq_prob=0.1,
                        do_whole_word_mask=False, nsp=True, cls_id=2, sep_id=3, mask_id=4,
                        replacement_ids=np.arange(5, 9, dtype=np.int32))
    sentence = (np.arange(5, 9, dtype=np.int32), np.zeros(4, dtype=bool))
    rng = random.Random(0)
    batches = pair_batches(TokenBlock([[sentence, sentence], [sentence]]), spec, rng, passes=1, batch=1)
    shuffled_records([encode_framed(mask_batch(b, spec, np.random.default_rng(0))[0]) for b in batches], rng)


class ShardWriter:
    """Tokenises blocks of documents and turns them into serialised, shuffled pretraining examples.

    Eval shards are masked at ``eval_masked_lm_prob`` (BERT's 0.15 unless set), whatever rate the
    training shards use, so held-out figures of runs with different masking rates compare.
    """

    def __init__(self, tokenizer, settings: dict, split: str, index: int):
        self.tokenizer = tokenizer
        self.settings = settings
        self.seed = (settings["random_seed"], 0 if split == "train" else 1, index)
        masked_lm_prob = settings["masked_lm_prob"] if split == TRAIN else settings["eval_masked_lm_prob"]
        self.spec = InstanceSpec(
            max_seq_length=settings["max_seq_length"],
            max_predictions_per_seq=settings["max_predictions_per_seq"],
            masked_lm_prob=masked_lm_prob,
            short_seq_prob=settings["short_seq_prob"],
            do_whole_word_mask=settings["do_whole_word_mask"] or settings["chinese_whole_word"],
            nsp=not settings["no_nsp"],
            cls_id=tokenizer.cls_id,
            sep_id=tokenizer.sep_id,
            mask_id=tokenizer.mask_id,
            replacement_ids=np.asarray(replacement_ids(tokenizer.inv_vocab), dtype=np.int32),
        )
        self.packer = SequencePacker(self.spec) if settings["pack_sequences"] else None

    def tokenize_block(self, block: list[list[str]]) -> TokenBlock:
        sentences = [s for doc in block for s in doc]
        if self.settings["chinese_whole_word"]:
            encoded = chinese_word_continuations(self.tokenizer, sentences)
        else:
            encoded = [(a, self.tokenizer.word_continuations(a)) for a in self.tokenizer.encode_batch(sentences)]
        docs, k = [], 0
        for doc in block:
            sents = [s for s in encoded[k:k + len(doc)] if len(s[0])]
            k += len(doc)
            if sents:
                docs.append(sents)
        return TokenBlock(docs)

    def block_records(self, block: list[list[str]], block_number: int, stats: ShardStats) -> tuple[np.ndarray, int]:
        """The block's records, framed, in a random order, and how many there are."""
        tokens = self.tokenize_block(block)
        stats.documents += len(tokens)
        stats.sentences += len(tokens.lengths)
        stats.tokens += len(tokens.ids)
        rng, np_rng = self._rngs(block_number)
        batches: list[tuple[np.ndarray, np.ndarray]] = []
        pending: list[Instances] = []
        for instances in self._instances(tokens, rng):
            pending.append(instances)
            if sum(len(p) for p in pending) >= BATCH:
                batches.append(self._encode(Instances.join(pending), np_rng, stats))
                pending = []
        if pending:
            batches.append(self._encode(Instances.join(pending), np_rng, stats))
        return shuffled_records(batches, rng)

    def _instances(self, tokens: TokenBlock, rng: random.Random) -> Iterator[Instances]:
        """``dupe_factor`` passes over the block: segment pairs per document, or packed sequences."""
        if self.packer is None:
            yield from pair_batches(tokens, self.spec, rng, self.settings["dupe_factor"], BATCH)
            return
        for _ in range(self.settings["dupe_factor"]):  # each pass in its own document order
            order = list(range(len(tokens)))
            rng.shuffle(order)
            yield self.packer.pack([tokens.document(i) for i in order])

    def last_records(self, block_number: int, stats: ShardStats) -> tuple[bytes | np.ndarray, int]:
        """What packing left over after the last block: the shard's one partly filled sequence."""
        last = self.packer.finish() if self.packer is not None else None
        if last is None:
            return b"", 0
        buffer, offsets = self._encode(last, self._rngs(block_number)[1], stats)
        return buffer, len(offsets) - 1

    def _rngs(self, block_number: int) -> tuple[random.Random, np.random.Generator]:
        seed = [*self.seed, block_number]
        return random.Random(hash_seed(seed)), np.random.Generator(np.random.PCG64(seed))

    def _encode(self, instances: Instances, np_rng, stats: ShardStats) -> tuple[np.ndarray, np.ndarray]:
        batch, real_tokens = mask_batch(instances, self.spec, np_rng)
        stats.instances += len(instances)
        stats.masked_tokens += int(batch["masked_lm_weights"].sum())
        stats.real_tokens += real_tokens
        stats.random_next += int(batch["next_sentence_labels"].sum())
        return encode_framed(batch)


def shuffled_records(batches: list[tuple[np.ndarray, np.ndarray]], rng: random.Random) -> tuple[np.ndarray, int]:
    """Framed records of several batches joined in the order ``rng.shuffle`` would give a list of them."""
    count = sum(len(offsets) - 1 for _, offsets in batches)
    return reordered(batches, shuffled_order(count, rng)), count


def hash_seed(parts) -> int:
    return int.from_bytes(hashlib.sha256(repr(list(parts)).encode()).digest()[:8], "little")


def chinese_word_continuations(tokenizer, sentences: list[str]) -> list[Sentence]:
    """Token ids, with a token marked as continuing a word when jieba puts it in the previous token's word."""
    import jieba

    jieba.setLogLevel(logging.WARNING)
    encodings = tokenizer.backend.encode_batch(sentences, add_special_tokens=False)
    result = []
    for text, encoding in zip(sentences, encodings, strict=True):
        word_of_char = np.zeros(len(text) + 1, dtype=np.int64)
        position = 0
        for word_index, word in enumerate(jieba.cut(text)):
            word_of_char[position:position + len(word)] = word_index
            position += len(word)
        starts = np.asarray([start for start, _ in encoding.offsets], dtype=np.int64)
        words = word_of_char[np.minimum(starts, len(text))]
        cont = np.zeros(len(starts), dtype=bool)
        cont[1:] = words[1:] == words[:-1]
        result.append((np.asarray(encoding.ids, dtype=np.int32), cont))
    return result
