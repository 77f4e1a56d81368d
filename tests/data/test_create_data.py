import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import unicodedata

import numpy as np
import pytest
from bert_reference import random_next_share
from corpora import BERT_SAMPLE, WIKITEXT, ZH_FORTUNES, needs_corpora
from shard_reading import originals, read_shards

from tpu_pretrain.config import Config
from tpu_pretrain.data.create import create_pretraining_data
from tpu_pretrain.data.pair_loop import truncation_counts
from tpu_pretrain.data.shard import read_blocks
from tpu_pretrain.data.tfrecord import read_records
from tpu_pretrain.data.tokenization import load_tokenizer
from tpu_pretrain.data.vocab import build_vocab
from tpu_pretrain.errors import UserInputError

SEQ, PRED = 128, 20


@pytest.fixture(scope="module")
def english(tmp_path_factory):
    root = tmp_path_factory.mktemp("english")
    vocab = build_vocab(Config.load(input=[str(WIKITEXT)], vocab_size=8000, output_dir=str(root)))
    config = Config.load(input=[str(WIKITEXT), str(BERT_SAMPLE)], vocab_file=vocab.path, output_dir=str(root / "data"),
                         split_sentences=True, do_whole_word_mask=True, dupe_factor=3, eval_fraction=0.02,
                         recipe="classic")  # BERT's own data: next-sentence pairs, 15% masking, 20 predictions
    manifest = create_pretraining_data(config)
    return root, vocab.path, config, manifest


@needs_corpora
def test_shards_parse_with_the_bert_schema_and_the_manifest_counts_them(english):
    root, _, _, manifest = english
    data = root / "data"
    batch = read_shards(data)
    assert batch["input_ids"].shape == (manifest.totals("train")["instances"], SEQ)
    assert batch["masked_lm_positions"].shape[1] == PRED
    assert manifest.files("eval")
    assert read_shards(data, "eval")["input_ids"].shape[0] == manifest.totals("eval")["instances"]
    on_disk = json.loads((data / "manifest.json").read_text())
    for shard in on_disk["shards"]:
        assert hashlib.sha256((data / shard["file"]).read_bytes()).hexdigest() == shard["sha256"]
        assert sum(1 for _ in read_records(data / shard["file"])) == shard["instances"]
    assert on_disk["vocab_sha256"] == hashlib.sha256((root / "vocab.txt").read_bytes()).hexdigest()
    assert on_disk["totals"]["train"]["masked_tokens"] == int(batch["masked_lm_weights"].sum())
    assert (data / "vocab.txt").read_bytes() == (root / "vocab.txt").read_bytes()


@needs_corpora
def test_masking_statistics_on_real_text(english):
    root, vocab_file, _, _ = english
    batch = read_shards(root / "data")
    tokenizer = load_tokenizer(vocab_file)
    ids, mask = originals(batch), batch["input_mask"].astype(bool)
    special = np.isin(ids, [tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id])
    real = mask & ~special
    weights = batch["masked_lm_weights"] > 0
    expected = np.minimum(PRED, np.maximum(1, np.round(real.sum(1) * 0.15)))
    assert abs(weights.sum() / real.sum() - 0.15) < 0.005
    assert abs(weights.sum() / expected.sum() - 1) < 0.05  # whole words may leave a little budget unused
    rows, slots = np.nonzero(weights)
    positions = batch["masked_lm_positions"][rows, slots]
    assert not special[rows, positions].any() and mask[rows, positions].all()  # never [CLS]/[SEP]/[PAD]
    shown = batch["input_ids"][rows, positions]
    truth = batch["masked_lm_ids"][rows, slots]
    shares = [np.mean(shown == tokenizer.mask_id), np.mean(shown == truth), np.mean((shown != truth) & (shown != 4))]
    assert abs(shares[0] - 0.8) < 0.02 and abs(shares[1] - 0.1) < 0.02 and abs(shares[2] - 0.1) < 0.02, shares
    # positions ascend within each example and padding slots are zero
    pos = np.where(weights, batch["masked_lm_positions"], SEQ + 1)
    assert (np.diff(np.sort(pos, axis=1), axis=1) >= 0).all() and (np.sort(pos, axis=1) == pos).all()
    assert (batch["masked_lm_ids"][~weights] == 0).all()


@needs_corpora
def test_whole_words_are_never_split_by_the_mask(english):
    root, vocab_file, _, _ = english
    batch = read_shards(root / "data")
    continuation = load_tokenizer(vocab_file).is_continuation
    ids = originals(batch)
    masked = np.zeros_like(ids, dtype=bool)
    rows, slots = np.nonzero(batch["masked_lm_weights"])
    masked[rows, batch["masked_lm_positions"][rows, slots]] = True
    cont = continuation[ids] & batch["input_mask"].astype(bool)
    cont[:, 0] = False
    # a continuation piece is masked exactly when the piece before it is (words start inside a segment)
    prev_is_special = np.isin(np.roll(ids, 1, axis=1), [2, 3])
    inside = cont & ~prev_is_special
    assert inside.sum() > 10000
    assert (masked[inside] == np.roll(masked, 1, axis=1)[inside]).all()


def _reference_share(config, vocab_file, dupe_factor):
    from tpu_pretrain.data.corpus import CorpusReader

    tokenizer = load_tokenizer(vocab_file)
    reader = CorpusReader(config.corpus.input, config.corpus, do_lower_case=True)
    docs = [[len(ids) for ids in tokenizer.encode_batch(doc) if len(ids)] for doc in reader.documents()]
    return random_next_share([d for d in docs if d], SEQ, 0.1, dupe_factor, seed=1)


@needs_corpora
def test_next_sentence_share_matches_the_original_algorithm(english):
    root, vocab_file, config, manifest = english
    expected = _reference_share(config, vocab_file, 3)
    labels = read_shards(root / "data")["next_sentence_labels"]
    assert abs(labels.mean() - expected) < 0.05, (labels.mean(), expected)


@needs_corpora
def test_documents_of_many_sentences_give_a_share_near_half(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(BERT_SAMPLE.read_text().splitlines() * 3) + "\n")
    vocab = build_vocab(Config.load(input=[str(WIKITEXT)], vocab_size=6000, output_dir=str(tmp_path),
                                    vocab_sample_lines=2000)).path
    config = Config.load(input=[str(corpus)], vocab_file=vocab, output_dir=str(tmp_path / "d"),
                         dupe_factor=100, eval_fraction=0, recipe="classic")
    create_pretraining_data(config)
    share = read_shards(tmp_path / "d")["next_sentence_labels"].mean()
    expected = _reference_share(config, vocab, 100)
    assert abs(share - expected) < 0.05 and 0.45 < share < 0.65, (share, expected)


@needs_corpora
def test_chinese_whole_word_masking_masks_every_character_of_a_jieba_word(tmp_path):
    import jieba

    # Sentences that end in 。 (no run of Chinese characters crosses a sentence boundary) and hold no space or
    # character the normaliser removes (the test rebuilds the text from tokens, which loses those).
    text = ZH_FORTUNES.read_text(encoding="utf-8")
    sentences = [line.strip() for line in text.splitlines() if line.strip().endswith("。")
                 and all(ch.isprintable() and not ch.isspace() and unicodedata.category(ch) != "Co"
                         for ch in line.strip())]
    corpus = tmp_path / "zh.txt"
    corpus.write_text("\n\n".join("\n".join(sentences[i:i + 4]) for i in range(0, 8000, 4)) + "\n", encoding="utf-8")
    vocab = build_vocab(Config.load(input=[str(ZH_FORTUNES)], doc_separator="%", vocab_size=21128,
                                    output_dir=str(tmp_path)))
    create_pretraining_data(Config.load(input=[str(corpus)], vocab_file=vocab.path, output_dir=str(tmp_path / "d"),
                                        chinese_whole_word=True, dupe_factor=1, eval_fraction=0, recipe="classic"))
    # Word boundaries as jieba gives them for each sentence, laid end to end in corpus order.
    from tpu_pretrain.data.corpus import CorpusReader

    config = Config.load(input=[str(corpus)])
    text, word_ids, next_id = [], [], 0
    for doc in CorpusReader(config.corpus.input, config.corpus, do_lower_case=True).documents():
        for sentence in doc:
            for word in jieba.cut(sentence):
                text.append(word)
                word_ids.extend([next_id] * len(word))
                next_id += 1
    text, word_ids = "".join(text), np.asarray(word_ids)
    batch = read_shards(tmp_path / "d")
    tokenizer = load_tokenizer(vocab.path)
    ids = originals(batch)
    checked = 0
    for row in range(len(ids)):
        masked = np.zeros(SEQ, dtype=bool)
        masked[batch["masked_lm_positions"][row][batch["masked_lm_weights"][row] > 0]] = True
        tokens = tokenizer.convert_ids_to_tokens(ids[row])
        sep = [i for i, t in enumerate(tokens) if t == "[SEP]"]
        for start, end in ((1, sep[0]), (sep[0] + 1, sep[-1])):
            segment = "".join(tokens[start:end])
            where = text.find(segment)
            if end <= start or where < 0 or len(segment) != end - start:
                continue
            words = word_ids[where:where + len(segment)]
            interior = (words != words[0]) & (words != words[-1])  # an edge word may have been truncated
            for word in np.unique(words[interior]):
                span = masked[start:end][words == word]
                if len(span) > 1 and span.any():
                    checked += 1
                    assert span.all(), (row, segment)
    assert checked > 500


def test_truncation_counts_match_the_original_loop():
    for la in range(0, 40):
        for lb in range(0, 40):
            a, b, cut = la, lb, [0, 0]
            while a + b > 30:
                if a > b:
                    a, cut[0] = a - 1, cut[0] + 1
                else:
                    b, cut[1] = b - 1, cut[1] + 1
            assert truncation_counts(la, lb, 30) == tuple(cut), (la, lb)


# -- determinism, resume, bad input ----------------------------------------------------------------
@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    root = tmp_path_factory.mktemp("small")
    from tpu_pretrain.data.sample_corpus import write_sample_corpus

    corpus = write_sample_corpus(root / "corpus.txt", max_chars=300_000)
    vocab = build_vocab(Config.load(input=[str(corpus)], vocab_size=4000, output_dir=str(root)))
    return corpus, vocab.path


def _settings(corpus, vocab, out, **extra):
    settings = {"num_shards": 3, "dupe_factor": 2, "eval_fraction": 0.05, "recipe": "classic"} | extra
    return Config.load(input=[str(corpus)], vocab_file=vocab, output_dir=str(out), **settings)


def _digests(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.tfrecord"))}


@pytest.mark.parametrize("pack_sequences", [False, True], ids=["pairs", "packed"])
def test_same_inputs_give_byte_identical_shards_whatever_the_workers(small_vocab, tmp_path, pack_sequences):
    corpus, vocab = small_vocab
    create_pretraining_data(_settings(corpus, vocab, tmp_path / "one", workers=1, pack_sequences=pack_sequences))
    create_pretraining_data(_settings(corpus, vocab, tmp_path / "two", workers=2, pack_sequences=pack_sequences))
    one, two = _digests(tmp_path / "one"), _digests(tmp_path / "two")
    assert len(one) == 4 and one == two


def test_rerun_skips_complete_shards_and_redoes_missing_or_partial_ones(small_vocab, tmp_path):
    corpus, vocab = small_vocab
    out = tmp_path / "d"
    create_pretraining_data(_settings(corpus, vocab, out, workers=1))
    before = _digests(out)
    stamps = {p.name: p.stat().st_mtime_ns for p in out.glob("*.tfrecord")}
    (out / "train-00001-of-00003.tfrecord").unlink()
    (out / "train-00002-of-00003.tfrecord").write_bytes(b"partial")  # a half-written shard under its name
    create_pretraining_data(_settings(corpus, vocab, out, workers=1))
    assert _digests(out) == before
    assert (out / "train-00000-of-00003.tfrecord").stat().st_mtime_ns == stamps["train-00000-of-00003.tfrecord"]
    assert not list(out.glob("*.tmp")) and not (out / ".work").exists()


@pytest.mark.parametrize("pack_sequences", [False, True], ids=["pairs", "packed"])
def test_a_killed_run_resumes_to_the_same_bytes(small_vocab, tmp_path, pack_sequences):
    corpus, vocab = small_vocab
    reference = tmp_path / "ref"
    create_pretraining_data(_settings(corpus, vocab, reference, workers=1, num_shards=6, dupe_factor=10,
                                      pack_sequences=pack_sequences))
    out = tmp_path / "killed"
    args = [sys.executable, "-m", "tpu_pretrain", "create-data", "--input", str(corpus), "--vocab_file", vocab,
            "--output_dir", str(out), "--num_shards", "6", "--dupe_factor", "10", "--eval_fraction", "0.05",
            "--workers", "1", f"--pack_sequences={pack_sequences}", "--recipe", "classic"]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not list(out.glob("train-0000[0-9]-of-00006.tfrecord.json")):
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (out / "manifest.json").exists(), "the run finished before it could be killed"
    assert subprocess.run(args, capture_output=True).returncode == 0
    assert _digests(out) == _digests(reference)


def test_output_folder_from_other_settings_is_refused_and_left_alone(small_vocab, tmp_path):
    corpus, vocab = small_vocab
    out = tmp_path / "d"
    create_pretraining_data(_settings(corpus, vocab, out))
    before = _digests(out)
    with pytest.raises(UserInputError, match=r"other settings \(max_seq_length: 128 there, 64 now"):
        create_pretraining_data(_settings(corpus, vocab, out, max_seq_length=64, max_predictions_per_seq=10))
    assert _digests(out) == before


def test_bad_input_errors_name_the_culprit(small_vocab, tmp_path):
    corpus, vocab = small_vocab
    with pytest.raises(UserInputError, match="missing.txt' does not exist"):
        create_pretraining_data(_settings(tmp_path / "missing.txt", vocab, tmp_path / "a"))
    no_mask = tmp_path / "no_mask.txt"
    no_mask.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n")
    with pytest.raises(UserInputError, match=r"lacks the special token\(s\) \[MASK\]"):
        create_pretraining_data(_settings(corpus, str(no_mask), tmp_path / "b"))
    unreadable = tmp_path / "vocab.bin"
    unreadable.write_bytes(b"\x80\x81\x82\n")
    with pytest.raises(UserInputError, match="vocab.bin' is not UTF-8"):
        create_pretraining_data(_settings(corpus, str(unreadable), tmp_path / "c"))
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n\x1b[0m\n")
    with pytest.raises(UserInputError, match="no usable line"):
        create_pretraining_data(_settings(empty, vocab, tmp_path / "e"))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "part-0.tfrecord").write_bytes(b"x")
    with pytest.raises(UserInputError, match="holds .tfrecord files but no manifest.json"):
        create_pretraining_data(_settings(corpus, vocab, foreign))
    assert (foreign / "part-0.tfrecord").read_bytes() == b"x"


def test_no_nsp_keeps_true_continuations(small_vocab, tmp_path):
    corpus, vocab = small_vocab
    manifest = create_pretraining_data(_settings(corpus, vocab, tmp_path / "d", no_nsp=True))
    batch = read_shards(tmp_path / "d")
    assert manifest.totals("train")["random_next"] == 0 and batch["next_sentence_labels"].sum() == 0
    assert batch["segment_ids"].max() == 1  # two segments where the document had more than one sentence


def test_work_files_are_read_back_in_bounded_blocks(tmp_path, monkeypatch):
    import tpu_pretrain.data.shard as module

    monkeypatch.setattr(module, "BLOCK_CHARS", 100)
    path = tmp_path / "w.txt"
    path.write_text("".join(f"sentence {i} of some length\nanother one\n\n" for i in range(20)))
    blocks = list(read_blocks(path))
    assert len(blocks) > 5 and sum(len(b) for b in blocks) == 20


def test_cli_create_data_prints_the_summary(small_vocab, tmp_path):
    corpus, vocab = small_vocab
    result = subprocess.run(
        [sys.executable, "-m", "tpu_pretrain", "create-data", "--input", str(corpus), "--vocab_file", vocab,
         "--output_dir", str(tmp_path / "d"), "--dupe_factor", "1", "--max_seq_length", "64",
         "--max_predictions_per_seq", "10", "--recipe", "classic"], capture_output=True, text=True, env={**os.environ})
    assert result.returncode == 0, result.stderr
    assert "train: " in result.stdout and "instances" in result.stdout
    derived = create_data_cli("--input", corpus, "--vocab_file", vocab, "--output_dir", tmp_path / "derived",
                              "--dupe_factor", "1", "--max_seq_length", "64", "--recipe", "classic")  # derived
    assert derived.returncode == 0, derived.stderr
    assert _digests(tmp_path / "derived") == _digests(tmp_path / "d")  # 10 for 64 at 0.15: the same bytes
    assert json.loads((tmp_path / "derived" / "manifest.json").read_text())["settings"]["max_predictions_per_seq"] == 10
    bad = subprocess.run([sys.executable, "-m", "tpu_pretrain", "create-data", "--input", str(corpus),
                          "--vocab_file", vocab, "--output_dir", str(tmp_path / "x"), "--max_seq_lenght", "64"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "max_seq_lenght" in bad.stderr


def test_summary_warns_when_next_sentence_prediction_degenerates():
    from tpu_pretrain.data.data_folder import Manifest, ShardStats

    shards = [ShardStats("train-00000-of-00001.tfrecord", "train", instances=100, random_next=93)]
    summary = Manifest(settings={"no_nsp": False}, vocab_size=10, vocab_sha256="", inputs=[], corpus_report="",
                       shards=shards).summary()
    assert "93% of instances have a random next segment" in summary and "--split_sentences" in summary
    shards[0].random_next = 52
    assert "warning" not in Manifest(settings={}, vocab_size=10, vocab_sha256="", inputs=[], corpus_report="",
                                     shards=shards).summary()


# -- what a user gets wrong, through the command line -----------------------------------------------------
def create_data_cli(*args, **popen):
    return subprocess.run([sys.executable, "-m", "tpu_pretrain", "create-data", *map(str, args)], capture_output=True,
                          text=True, timeout=300, **popen)


def test_degenerate_next_sentence_data_is_warned_with_the_fix(small_vocab, tmp_path):
    corpus, vocab = small_vocab
    text = corpus.read_text()
    one_document = tmp_path / "no_blank_lines.txt"
    one_document.write_text("\n".join(line for line in text.splitlines() if line.strip()) + "\n")
    shape = ("--recipe", "classic", "--dupe_factor", "1", "--max_seq_length", "64", "--max_predictions_per_seq", "10")
    done = create_data_cli("--input", one_document, "--vocab_file", vocab, "--output_dir", tmp_path / "a", *shape)
    out = " ".join(done.stdout.split())
    assert done.returncode == 0 and "warning: only 0% of instances have a random next segment" in out, out
    assert "Separate documents with blank lines" in out and "warning: no eval shard: 1 document(s)" in out
    few = tmp_path / "few_documents.txt"
    few.write_text("\n\n".join(text.split("\n\n")[:12]) + "\n")
    done = create_data_cli("--input", few, "--vocab_file", vocab, "--output_dir", tmp_path / "b", "--num_shards", "40",
                           *shape)
    out = " ".join(done.stdout.split())
    assert done.returncode == 0 and "instances have a random next segment" in out and "fewer --num_shards" in out
    done = create_data_cli("--input", corpus, "--vocab_file", vocab, "--output_dir", tmp_path / "c", *shape)
    warnings = [line for line in done.stdout.splitlines() if line.startswith("warning")]
    assert done.returncode == 0 and len(warnings) == 1, done.stdout  # a healthy corpus for NSP, but the default
    # 1% held out of a 0.3 MB corpus is too few sequences to tell runs apart: said, with the setting and its value
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    held_out = manifest["totals"]["eval"]["instances"]
    assert 0 < held_out < 300 and warnings[0].startswith(f"warning: the held-out split has only {held_out} sequences")
    assert f"Raise --eval_fraction (now 0.01) to about {0.01 * 300 / held_out:.2g} for 300 or more" in warnings[0]
    done = create_data_cli("--input", corpus, "--vocab_file", vocab, "--output_dir", tmp_path / "e", *shape,
                           "--eval_fraction", f"{0.01 * 300 / held_out:.2g}")
    assert done.returncode == 0 and "warning" not in done.stdout, done.stdout  # as advised: enough held out


def test_an_output_that_is_a_file_read_only_or_full_is_a_message(small_vocab, tmp_path, mount_tmpfs):
    corpus, vocab = small_vocab
    (tmp_path / "out.txt").write_text("mine")
    done = create_data_cli("--input", corpus, "--vocab_file", vocab, "--output_dir", tmp_path / "out.txt")
    assert done.returncode == 2 and "output_dir" in done.stderr and "is a file, not a folder" in done.stderr
    assert (tmp_path / "out.txt").read_text() == "mine"
    read_only = mount_tmpfs("read_only", read_only=True)
    started = time.time()
    done = create_data_cli("--input", corpus, "--vocab_file", vocab, "--output_dir", read_only / "data")
    assert done.returncode == 2 and "is not writable (Read-only file system" in done.stderr, done.stderr
    assert time.time() - started < 30  # before the slow work, not after it
    full = mount_tmpfs("full", size="400k")
    done = create_data_cli("--input", corpus, "--vocab_file", vocab, "--output_dir", full / "data",
                           "--dupe_factor", "5", "--workers", "1")
    assert done.returncode == 2 and f"The disk under {full / 'data'} is full" in done.stderr, done.stderr[-2000:]
    assert "run the same command again" in done.stderr and "Traceback" not in done.stderr


def test_ctrl_c_stops_with_a_message_and_no_traceback(small_vocab, tmp_path):
    corpus, vocab = small_vocab
    big = tmp_path / "big.txt"
    big.write_text(corpus.read_text() * 12)
    out = tmp_path / "d"
    process = subprocess.Popen(
        [sys.executable, "-m", "tpu_pretrain", "create-data", "--input", str(big), "--vocab_file", vocab,
         "--output_dir", str(out), "--dupe_factor", "5", "--workers", "2", "--num_shards", "4"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a terminal has it (a background job
    deadline = time.time() + 120  # of a script would inherit Ctrl-C ignored)
    while time.time() < deadline and not list(out.glob("*.tfrecord.tmp")):  # a worker is writing a shard: the
        time.sleep(0.01)  # pool has started (a Ctrl-C while it starts is ignored by all, the workers to stay quiet)
    os.killpg(process.pid, signal.SIGINT)  # as a terminal's Ctrl-C does: the parent and its workers
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err[-3000:]
    assert "interrupted" in err and "Traceback" not in err and "KeyboardInterrupt" not in err
    assert not (out / "manifest.json").exists()


def test_the_automatic_shard_count_is_what_the_help_says():
    from tpu_pretrain.data.create import auto_num_shards

    said = " ".join(create_data_cli("--help").stdout.split())
    assert "0: one per 16 MB of text, and at least 8 so that worker processes share the work (under 2 MB of text: " \
           "one per 256 KB)" in said
    mb = 1 << 20
    assert [auto_num_shards(n) for n in (100_000, mb, 2 * mb, 100 * mb, 1000 * mb)] == [1, 4, 8, 8, 63]
