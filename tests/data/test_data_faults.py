"""The data steps as careless or unlucky users meet them (issue 24): a vocab.txt in the output folder, a corpus
edited in place or named by another path, create-data stopped by SIGTERM and its unfinished folder given to train,
a data folder whose vocab.txt was swapped, a corpus whose only line is over-long."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tpu_pretrain.config import Config
from tpu_pretrain.core.resolve import RunPlan
from tpu_pretrain.data.create import create_pretraining_data
from tpu_pretrain.data.sample_corpus import write_sample_corpus
from tpu_pretrain.data.vocab import build_vocab
from tpu_pretrain.errors import UserInputError


@pytest.fixture(scope="module")
def corpus_and_vocab(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    corpus = write_sample_corpus(root / "corpus.txt", max_chars=40_000)
    return corpus, build_vocab(Config.load(input=[str(corpus)], vocab_size=1200, num_unused_tokens=5,
                                           output_dir=str(root))).path


def settings(corpus, vocab, out, **extra):
    return Config.load(input=[str(corpus)], vocab_file=str(vocab), output_dir=str(out), max_seq_length=32,
                       max_predictions_per_seq=5, dupe_factor=1, num_shards=2, workers=1, **extra)


def files_of(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_vocab_already_in_the_output_folder_is_never_replaced(corpus_and_vocab, tmp_path):
    corpus, vocab = corpus_and_vocab
    other = tmp_path / "other_vocab.txt"
    tokens = Path(vocab).read_text().splitlines()
    other.write_text("\n".join(tokens + ["extra1", "extra2"]) + "\n")
    out = tmp_path / "data"
    out.mkdir()
    (out / "vocab.txt").write_bytes(Path(vocab).read_bytes())  # as `tpu-pretrain vocab --output_dir data` leaves it
    before = files_of(out)
    with pytest.raises(UserInputError, match=f"{out / 'vocab.txt'} exists and is not the --vocab_file {other}"):
        create_pretraining_data(settings(corpus, other, out))
    assert files_of(out) == before  # refused before anything was written
    create_pretraining_data(settings(corpus, out / "vocab.txt", out))  # the advice given works
    with pytest.raises(UserInputError, match="vocab_file: a different vocab"):
        create_pretraining_data(settings(corpus, other, out))


def test_a_corpus_counts_by_content_not_by_path_or_size(corpus_and_vocab, tmp_path, monkeypatch):
    _, vocab = corpus_and_vocab
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(Path(corpus_and_vocab[0]).read_text())
    out = tmp_path / "data"
    create_pretraining_data(settings(corpus.resolve(), vocab, out))
    shards = {p.name: p.stat().st_mtime_ns for p in out.glob("*.tfrecord")}
    monkeypatch.chdir(tmp_path)  # the same file by a relative path: the same data, nothing rewritten
    create_pretraining_data(settings(Path("corpus.txt"), vocab, Path("data")))
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.tfrecord")} == shards

    text = corpus.read_text()
    corpus.write_text(text.replace("e", "a", 50))  # edited in place, same size
    assert corpus.stat().st_size == len(text.encode())
    before = files_of(out)
    with pytest.raises(UserInputError, match=rf"input: {corpus.resolve()} \(\d+ bytes\) has other content"):
        create_pretraining_data(settings(corpus, vocab, out))
    assert files_of(out) == before


def test_sigterm_stops_create_data_cleanly_and_train_refuses_the_unfinished_folder(corpus_and_vocab, tmp_path):
    corpus, vocab = corpus_and_vocab
    big = tmp_path / "big.txt"
    big.write_text(Path(corpus).read_text() * 12)
    out = tmp_path / "d"
    args = [sys.executable, "-m", "tpu_pretrain", "create-data", "--input", str(big), "--vocab_file", vocab,
            "--output_dir", str(out), "--dupe_factor", "3", "--workers", "2", "--num_shards", "4",
            "--max_seq_length", "64", "--max_predictions_per_seq", "10"]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (out / ".work" / "partition.json").exists():
        time.sleep(0.01)
    time.sleep(0.3)  # the workers are writing shards
    process.send_signal(signal.SIGTERM)  # the parent alone, as a job scheduler or `kill` sends it
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err[-3000:]
    assert "interrupted" in err and "run the same command again" in err, err[-3000:]
    for noise in ("Traceback", "BrokenPipeError", "leaked semaphore"):
        assert noise not in err, err[-3000:]
    assert not (out / "manifest.json").exists(), "create-data finished before the signal"

    # train does not take the unfinished folder, whatever else it is given, and says how to finish it
    unfinished = Config.load(data_dir=str(out), vocab_file=vocab, output_dir=str(tmp_path / "run"),
                             model_size="L2-H128", train_batch_size=8)
    with pytest.raises(UserInputError, match=r"is unfinished: create-data stopped before it wrote manifest.json "
                                             r"\(\d of 5 shards are complete\)\. Run the same create-data command"):
        RunPlan.resolve(unfinished)
    finished = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert RunPlan.resolve(unfinished).data.train_instances > 0
    assert not list(out.glob(".work"))


def test_a_data_folder_whose_vocab_was_swapped_is_refused(corpus_and_vocab, tmp_path):
    corpus, vocab = corpus_and_vocab
    out = tmp_path / "data"
    create_pretraining_data(settings(corpus, vocab, out))
    tokens = (out / "vocab.txt").read_text().splitlines()
    tokens[300], tokens[301] = tokens[301], tokens[300]  # same size, other words
    (out / "vocab.txt").write_text("\n".join(tokens) + "\n")
    config = Config.load(data_dir=str(out), output_dir=str(tmp_path / "run"), model_size="L2-H128",
                         train_batch_size=8)
    with pytest.raises(UserInputError, match=f"{out / 'vocab.txt'} is not the vocab the data .* sha256 differs"):
        RunPlan.resolve(config)


def test_a_corpus_whose_only_line_is_too_long_names_the_limit(tmp_path):
    corpus = tmp_path / "one_line.txt"
    corpus.write_text("word " * 5000 + "\n")  # 25,000 characters, over the default 20,000
    for make in (lambda: build_vocab(Config.load(input=[str(corpus)], output_dir=str(tmp_path / "v"))),
                 lambda: create_pretraining_data(Config.load(input=[str(corpus)], output_dir=str(tmp_path / "d"),
                                                             vocab_file=str(tmp_path / "vocab.txt")))):
        (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "word"]) + "\n")
        with pytest.raises(UserInputError, match=r"no usable line.*1 over-long lines dropped \(over "
                                                 r"max_line_length=20000 characters; raise --max_line_length"):
            make()
    assert not os.path.exists(tmp_path / "v" / "vocab.txt")
