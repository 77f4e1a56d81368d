"""Packed sequences (RoBERTa's full sentences): full, every token used dupe_factor times in order, masked as
unpacked data is, whole words kept whole, and eval shards masked at 0.15 whatever the training rate."""

import random

import numpy as np
import pytest
from bert_reference import segment_pairs
from corpora import BERT_SAMPLE, WIKITEXT, ZH_FORTUNES, needs_corpora
from shard_reading import originals, read_shards

from tpu_pretrain.config import Config
from tpu_pretrain.data.corpus import CorpusReader
from tpu_pretrain.data.create import create_pretraining_data
from tpu_pretrain.data.data_folder import Manifest, ShardStats
from tpu_pretrain.data.instances import (
    Instances,
    InstanceSpec,
    SequencePacker,
    TokenBlock,
    _select_masked,
    pair_batches,
)
from tpu_pretrain.data.tfrecord import decode_example, read_records
from tpu_pretrain.data.tokenization import load_tokenizer
from tpu_pretrain.data.vocab import build_vocab

SEQ, DUPE = 128, 2
CLS, SEP, PAD = 2, 3, 0


@pytest.fixture(scope="module", params=["english", "chinese"])
def packed(request, tmp_path_factory):
    """Packed shards of real text: WikiText-2 + BERT's sample (long documents), zh_fortunes (short ones)."""
    root = tmp_path_factory.mktemp(f"packed_{request.param}")
    if request.param == "english":
        corpus = {"input": [str(WIKITEXT), str(BERT_SAMPLE)], "split_sentences": True}
    else:
        corpus = {"input": [str(ZH_FORTUNES)], "doc_separator": "%", "chinese_whole_word": True}
    vocab = build_vocab(Config.load(**corpus, vocab_size=6000, vocab_sample_lines=20000,
                                    output_dir=str(root))).path
    config = Config.load(**corpus, vocab_file=vocab, output_dir=str(root / "data"), pack_sequences=True,
                         do_whole_word_mask=True, dupe_factor=DUPE, eval_fraction=0.02, num_shards=3,
                         recipe="classic")  # packing alone: BERT's masking, as unpacked
    return root / "data", vocab, config, create_pretraining_data(config)


def shard_rows(data_dir, manifest, split="train"):
    """Every record of a split as token ids before masking, and which rows are the last of their shard."""
    rows, last = [], []
    for name in manifest.files(split):
        records = list(read_records(data_dir / name))
        for index, record in enumerate(records):
            example = decode_example(record)
            ids = np.asarray(example["input_ids"])
            weights = np.asarray(example["masked_lm_weights"]) > 0
            ids[np.asarray(example["masked_lm_positions"])[weights]] = np.asarray(example["masked_lm_ids"])[weights]
            rows.append(ids)
            last.append(index == len(records) - 1)
    return np.stack(rows), np.asarray(last)


@needs_corpora
def test_packed_sequences_are_full_and_single_segment(packed):
    data_dir, _, _, manifest = packed
    ids, last = shard_rows(data_dir, manifest)
    real = (ids != PAD) & (ids != CLS) & (ids != SEP)
    fill = real[~last].sum() / (len(ids[~last]) * SEQ)
    print(f"fill {fill:.4f} (manifest: {manifest.fill():.4f}), {len(ids)} sequences")
    assert fill >= 0.95 and manifest.fill() >= 0.94
    assert (ids[:, 0] == CLS).all() and not (ids[:, 1] == SEP).any()  # never a separator right after [CLS]
    batch = read_shards(data_dir)
    assert batch["segment_ids"].max() == 0 and batch["next_sentence_labels"].max() == 0
    assert manifest.settings["no_nsp"] is True  # packing is MLM only, and says so for training


@needs_corpora
def test_every_token_appears_in_order_dupe_factor_times(packed):
    data_dir, vocab, config, manifest = packed
    tokenizer = load_tokenizer(vocab)
    reader = CorpusReader(config.corpus.input, config.corpus, do_lower_case=True)
    documents = [np.concatenate([ids for ids in tokenizer.encode_batch(doc) if len(ids)] or [np.zeros(0, np.int32)])
                 for doc in reader.documents()]
    text = "\n".join("".join(chr(0x100 + int(t)) for t in doc) for doc in documents)
    rows = np.concatenate([shard_rows(data_dir, manifest, split)[0] for split in ("train", "eval")])
    pieces = []
    for row in rows:
        content = row[1:int(np.count_nonzero(row)) - 1]  # between [CLS] and the closing [SEP]
        cuts = np.flatnonzero(content == SEP)
        pieces += [kept for part in np.split(content, cuts) if len(kept := part[part != SEP])]
    # the multiset of tokens: every token of the corpus exactly DUPE times
    used = np.bincount(np.concatenate(pieces), minlength=tokenizer.vocab_size)
    corpus = np.bincount(np.concatenate(documents), minlength=tokenizer.vocab_size)
    np.testing.assert_array_equal(used, DUPE * corpus)
    # in order: every run between separators is a stretch of one document
    rng = np.random.default_rng(0)
    for index in rng.choice(len(pieces), 400, replace=False):
        assert "".join(chr(0x100 + int(t)) for t in pieces[index]) in text


@needs_corpora
def test_masking_statistics_and_whole_words_as_unpacked(packed):
    data_dir, vocab, config, _ = packed
    batch = read_shards(data_dir)
    tokenizer = load_tokenizer(vocab)
    ids, mask = originals(batch), batch["input_mask"].astype(bool)
    special = np.isin(ids, [CLS, SEP, PAD])
    weights = batch["masked_lm_weights"] > 0
    real = mask & ~special
    assert abs(weights.sum() / real.sum() - 0.15) < 0.005
    rows, slots = np.nonzero(weights)
    positions = batch["masked_lm_positions"][rows, slots]
    assert not special[rows, positions].any()  # never [CLS], [SEP] (between documents too) or padding
    shown, truth = batch["input_ids"][rows, positions], batch["masked_lm_ids"][rows, slots]
    shares = [np.mean(shown == tokenizer.mask_id), np.mean(shown == truth)]
    assert abs(shares[0] - 0.8) < 0.02 and abs(shares[1] - 0.1) < 0.02, shares
    if config.data.chinese_whole_word:
        return  # jieba's words: checked on unpacked data in test_create_data
    masked = np.zeros_like(ids, dtype=bool)
    masked[rows, positions] = True
    cont = tokenizer.is_continuation[ids] & mask
    assert not cont[:, 1].any()  # a sequence never starts inside a word
    inside = cont & ~np.isin(np.roll(ids, 1, axis=1), [CLS, SEP])
    inside[:, 0] = False
    assert inside.sum() > 10000
    assert (masked[inside] == np.roll(masked, 1, axis=1)[inside]).all()


def test_the_packer_cuts_at_word_starts_and_keeps_the_rest():
    spec = InstanceSpec(max_seq_length=8, max_predictions_per_seq=2, masked_lm_prob=0.15, short_seq_prob=0,
                        do_whole_word_mask=True, nsp=False, cls_id=CLS, sep_id=SEP, mask_id=4,
                        replacement_ids=np.arange(5, 50, dtype=np.int32))

    def sentence(ids, cont):
        return np.asarray(ids, np.int32), np.asarray(cont, bool)

    def segments(instances):
        return [list(instances.ids[start:start + length]) for start, length in
                zip(instances.a_start, instances.a_len, strict=True)]

    packer = SequencePacker(spec)  # 6 content tokens per sequence
    block = TokenBlock([[sentence([10, 11, 12], [0, 0, 1]), sentence([13, 14], [0, 1])],
                        [sentence([20, 21, 22, 23], [0, 1, 1, 0])]])
    out = packer.pack([block.document(0), block.document(1)])
    # 10 11 12 13 14 [SEP] | 20 21 22 ... : the first sequence drops its trailing separator
    assert segments(out) == [[10, 11, 12, 13, 14]]
    out = packer.pack([TokenBlock([[sentence([30, 31, 32, 33], [0, 1, 1, 1])]]).document(0)])
    # 20 21 22 23 [SEP] 30 | 31 ... would split the word 30-33: the cut moves back to its start
    assert segments(out) == [[20, 21, 22, 23]]
    assert segments(packer.finish()) == [[30, 31, 32, 33]] and packer.finish() is None


@needs_corpora
def test_a_higher_training_masking_rate_leaves_the_eval_shards_at_bert_rate(tmp_path):
    vocab = build_vocab(Config.load(input=[str(WIKITEXT)], vocab_size=3000, vocab_sample_lines=5000,
                                    output_dir=str(tmp_path))).path
    manifest = create_pretraining_data(Config.load(input=[str(WIKITEXT)], vocab_file=vocab, recipe="modern",
                                                   output_dir=str(tmp_path / "d"), dupe_factor=1, eval_fraction=0.05))
    train, evals = manifest.totals("train"), manifest.totals("eval")
    assert manifest.settings["max_predictions_per_seq"] == 39  # 0 (the recipe's): enough for 30% of 126 tokens
    assert abs(train["masked_tokens"] / train["real_tokens"] - 0.3) < 0.005
    assert abs(evals["masked_tokens"] / evals["real_tokens"] - 0.15) < 0.01
    assert manifest.settings["pack_sequences"] and manifest.fill() > 0.95


def test_summary_reports_fill_and_warns_when_sequences_are_mostly_padding():
    def summary(real_tokens, **settings):
        shards = [ShardStats("train-00000-of-00001.tfrecord", "train", instances=10, real_tokens=real_tokens)]
        return Manifest(settings={"max_seq_length": 128, "no_nsp": True, **settings}, vocab_size=10, vocab_sha256="",
                        inputs=[], corpus_report="", shards=shards).summary()

    low = summary(400)
    assert "fill 0.31" in low and "warning: fill 0.31" in low and "--pack_sequences" in low
    assert "fill 0.94" in summary(1200) and "warning" not in summary(1200)
    assert "warning" not in summary(400, pack_sequences=True)  # packing already does what it can


@pytest.mark.parametrize("nsp", [True, False])
def test_segment_pairs_as_spans_are_googles_pairs(nsp):
    """The compiled loop on spans gives, token for token, the pairs the written-out algorithm builds from lists
    with Python's random.Random, on documents with sentences longer than a sequence (truncation) and of one
    sentence (random next), and leaves the generator where the written-out algorithm leaves it."""
    lengths = np.random.default_rng(7)
    next_id = iter(range(1000, 10**6))
    docs = [[[next(next_id) for _ in range(int(lengths.integers(1, 90)))] for _ in range(int(lengths.integers(1, 6)))]
            for _ in range(40)]
    spec = InstanceSpec(max_seq_length=64, max_predictions_per_seq=10, masked_lm_prob=0.15, short_seq_prob=0.3,
                        do_whole_word_mask=False, nsp=nsp, cls_id=CLS, sep_id=SEP, mask_id=4,
                        replacement_ids=np.arange(5, 50, dtype=np.int32))
    block = TokenBlock([[(np.asarray(s, np.int32), np.zeros(len(s), bool)) for s in doc] for doc in docs])
    ours, reference = random.Random(3), random.Random(3)
    expected = []
    for _ in range(3):
        for index in range(len(docs)):
            expected += segment_pairs(docs, index, spec.max_seq_length, spec.short_seq_prob, nsp, reference)
    batches = pair_batches(block, spec, ours, passes=3, batch=50)
    assert all(len(b) >= 50 for b in batches[:-1])
    got = Instances.join(batches)
    pairs = [(block.ids[a:a + la].tolist(), block.ids[b:b + lb].tolist(), bool(r)) for a, la, b, lb, r in
             zip(got.a_start, got.a_len, got.b_start, got.b_len, got.random_next, strict=True)]
    assert len(pairs) > 100 and pairs == expected
    assert any(len(a) + len(b) == spec.max_seq_length - 3 for a, b, _ in pairs)  # truncation happened
    assert ours.getstate() == reference.getstate()


@pytest.mark.parametrize("whole_word", [True, False])
def test_the_mask_selection_is_the_greedy_walk_over_words_in_random_order(whole_word):
    draw = np.random.default_rng(11)
    n, length = 300, 48
    real = np.arange(length)[None, :] < draw.integers(2, length, n)[:, None]
    real[:, 0] = False  # [CLS]
    cont = draw.random((n, length)) < 0.5
    spec = InstanceSpec(max_seq_length=length, max_predictions_per_seq=7, masked_lm_prob=0.2, short_seq_prob=0,
                        do_whole_word_mask=whole_word, nsp=False, cls_id=CLS, sep_id=SEP, mask_id=4,
                        replacement_ids=np.arange(5, 50, dtype=np.int32))
    chosen = _select_masked(real, cont, spec, np.random.default_rng(5))
    prev_real = np.zeros_like(real)
    prev_real[:, 1:] = real[:, :-1]
    starts = real & ~(cont & prev_real) if whole_word else real
    width = max(int(starts.sum(axis=1).max()), 1)
    keys = np.random.default_rng(5).random((n, width))  # the draw _select_masked makes first
    for row in range(n):
        words = []  # each word: its positions
        for position in np.flatnonzero(real[row]):
            if starts[row, position]:
                words.append([])
            words[-1].append(position)
        budget = min(spec.max_predictions_per_seq, max(1, round(real[row].sum() * spec.masked_lm_prob)))
        taken, expected = 0, np.zeros(length, bool)
        for word in np.argsort(np.where(np.arange(width) < len(words), keys[row], 2.0))[:len(words)]:
            if taken + len(words[word]) <= budget:
                expected[words[word]] = True
                taken += len(words[word])
        assert (chosen[row] == expected).all(), row
