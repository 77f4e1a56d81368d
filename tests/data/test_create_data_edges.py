"""create-data at the edges (issue 37): corpora too small for a shard or a split, two runs into one folder, the
corpus folder given as the output, a parquet 'text' column that holds no text."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from shard_reading import read_shards

from tpu_pretrain.config import Config
from tpu_pretrain.core.run_lock import trainer_line
from tpu_pretrain.data.create import create_pretraining_data
from tpu_pretrain.data.sample_corpus import write_sample_corpus
from tpu_pretrain.data.tfrecord import read_records
from tpu_pretrain.data.vocab import build_vocab
from tpu_pretrain.errors import UserInputError


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    root = tmp_path_factory.mktemp("edges")
    corpus = write_sample_corpus(root / "corpus.txt", max_chars=60_000)
    return build_vocab(Config.load(input=[str(corpus)], vocab_size=1200, num_unused_tokens=5,
                                   output_dir=str(root))).path


def make(corpus, vocab, out, **settings):
    return create_pretraining_data(Config.load(input=[str(corpus)], vocab_file=vocab, output_dir=str(out),
                                               workers=1, **{"recipe": "classic", **settings}))


@pytest.mark.parametrize("text, settings", [
    ("One line only, of a few words.\n", dict(pack_sequences=True, dupe_factor=1)),
    ("First document.\n\nSecond document.\n", dict(pack_sequences=True)),
    ("First document.\n\nSecond document.\n", dict(num_shards=50)),
    ("First document.\n\nSecond document.\n", {}),
], ids=["one-line-packed", "two-documents-packed", "two-documents-50-shards", "two-documents"])
def test_a_tiny_corpus_gives_shards_with_or_without_instances_never_a_crash(vocab, tmp_path, text, settings):
    corpus = tmp_path / "tiny.txt"
    corpus.write_text(text)
    manifest = make(corpus, vocab, tmp_path / "data", **settings)
    on_disk = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert len(on_disk["shards"]) == settings.get("num_shards", 1) + (text.count("\n\n") > 0)
    for shard in manifest.shards:  # every shard listed is there and holds what the manifest says
        assert sum(1 for _ in read_records(tmp_path / "data" / shard.file)) == shard.instances
    summary = manifest.summary()
    if settings.get("pack_sequences"):  # a document shorter than a sequence still gives its partial one
        assert manifest.totals("train")["instances"] >= 1 and "no training instances" not in summary
    else:  # one-sentence documents alone in their shard give no segment pair: said, with the fix
        assert "warning: no training instances (from 1 documents)" in summary
        assert "warning: the held-out split is empty: its 1 document(s) gave no instance" in summary
        assert "Raise --eval_fraction (now 0.01), or give a larger corpus" in summary


def test_an_eval_split_of_documents_shorter_than_a_sequence_is_written(vocab, tmp_path):
    """The modern recipe at length 256 on a corpus of one-line articles: the held-out article is shorter than a
    sequence (before, its block gave no full sequence and the worker crashed)."""
    articles = [" ".join(f"Article {a} sentence {s} holds a few words of text." for s in range(40 if a else 4))
                for a in range(30)]
    table = tmp_path / "articles.parquet"
    pq.write_table(pa.table({"text": articles[1:2] + articles[:1] + articles[2:]}), table)
    manifest = make(table, vocab, tmp_path / "data", recipe="modern", max_seq_length=256, dupe_factor=1)
    assert manifest.totals("eval")["documents"] == 1 and manifest.totals("eval")["instances"] == 1
    assert read_shards(tmp_path / "data", "eval")["input_ids"].shape == (1, 256)


def test_two_create_data_runs_into_one_folder_the_second_is_refused_naming_the_first(vocab, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(write_sample_corpus(tmp_path / "sample.txt", max_chars=150_000).read_text() * 4)
    out = tmp_path / "data"
    command = [sys.executable, "-m", "tpu_pretrain", "create-data", "--input", str(corpus), "--vocab_file", vocab,
               "--output_dir", str(out), "--num_shards", "4", "--dupe_factor", "5", "--workers", "1"]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not list(out.glob("*.tfrecord.tmp")):
        time.sleep(0.01)
    second = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert second.returncode == 2, second.stderr[-2000:]
    said = " ".join(second.stderr.split())
    assert f"Another create-data process holds this data folder: pid {first.pid}" in said
    assert "Two create-data runs in one output_dir would write and remove each other's files" in said
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-2000:]
    assert (out / "manifest.json").is_file() and not list(out.glob("*.tmp")) and not (out / "create-data.lock").exists()
    shards = {p.name: p.read_bytes() for p in out.glob("*.tfrecord")}
    killed = subprocess.Popen([*command, "--output_dir", str(tmp_path / "again")], stderr=subprocess.DEVNULL)
    while time.time() < deadline + 120 and not (tmp_path / "again" / "create-data.lock").exists():
        time.sleep(0.01)
    killed.send_signal(signal.SIGKILL)  # a runtime that disconnected leaves its lock
    killed.wait()
    done = subprocess.run([*command, "--output_dir", str(tmp_path / "again")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and f"Took over the lock {tmp_path / 'again' / 'create-data.lock'}" in done.stderr
    assert {p.name: p.read_bytes() for p in (tmp_path / "again").glob("*.tfrecord")} == shards


def test_a_lock_holding_garbage_or_a_folder_at_the_lock_path_is_said_for_what_it_is(vocab, tmp_path, caplog):
    corpus = write_sample_corpus(tmp_path / "corpus.txt", max_chars=20_000)
    out = tmp_path / "data"
    out.mkdir()
    (out / "create-data.lock").write_text("not a lock\n")
    with pytest.raises(UserInputError) as refused:
        make(corpus, vocab, out)
    said = str(refused.value)
    assert f"The lock file {out / 'create-data.lock'} is unreadable: it names no holder" in said
    assert "pid None" not in said and "1970" not in said and "If no create-data process is at work" in said
    assert (out / "create-data.lock").read_text() == "not a lock\n"
    (out / "create-data.lock").unlink()
    (out / "create-data.lock").mkdir()
    (out / "create-data.lock" / "kept.txt").write_text("mine")
    os.utime(out / "create-data.lock", (time.time() - 3600, time.time() - 3600))  # old: never taken over either
    with pytest.raises(UserInputError, match="is a folder, not a lock file: a create-data process takes its lock "
                                             "there before it writes the data folder. Move or rename it"):
        make(corpus, vocab, out)
    assert (out / "create-data.lock" / "kept.txt").read_text() == "mine"
    assert "(the lock path" in trainer_line(out / "create-data.lock")  # status says so of a run folder's lock
    shutil.rmtree(out / "create-data.lock")
    (out / "create-data.lock").write_text("{}")
    os.utime(out / "create-data.lock", (time.time() - 60, time.time() - 60))  # unreadable and past a heartbeat
    make(corpus, vocab, out)
    assert f"Took over the lock {out / 'create-data.lock'} from no holder it names" in caplog.text


def test_the_corpus_folder_is_refused_as_the_output(vocab, tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    corpus = write_sample_corpus(folder / "corpus.txt", max_chars=20_000)
    for given, out, how in [(corpus, folder, "is the folder"), (folder, folder / "data", "is inside the folder")]:
        with pytest.raises(UserInputError, match=f"output_dir {out} {how} of the corpus") as refused:
            make(given, vocab, out)
        assert f"Choose an --output_dir outside it (e.g. {tmp_path / 'data'})" in str(refused.value)
    assert sorted(os.listdir(folder)) == ["corpus.txt"]  # nothing written there
    make(corpus, vocab, tmp_path / "data", dupe_factor=1)  # beside it is fine


@pytest.mark.parametrize("column, kind", [(pa.array([1, 2, 3]), "int64"), (pa.array([["a", "b"], ["c"], []]), "list<")],
                         ids=["ints", "lists"])
def test_a_text_column_that_holds_no_text_is_said_plainly(vocab, tmp_path, column, kind):
    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": column, "id": pa.array(["x", "y", "z"])}), table)
    with pytest.raises(UserInputError) as refused:
        make(table, vocab, tmp_path / "data")
    said = str(refused.value)
    assert f"{table}: its 'text' column holds {kind}" in said and "not text (text columns: id)" in said, said
    assert "?column=NAME" in said and "has no 'text' column" not in said


def test_a_model_folder_holding_a_vocab_txt_is_a_vocab_file_for_both_steps(vocab, tmp_path):
    """create-data and train take the folder of a released BERT (its vocab.txt) as --vocab_file (issue 37, item
    14); a folder holding no vocab says so."""
    from tpu_pretrain.core.resolve import RunPlan

    model = tmp_path / "released"
    model.mkdir()
    shutil.copy(vocab, model / "vocab.txt")
    corpus = write_sample_corpus(tmp_path / "corpus.txt", max_chars=20_000)
    make(corpus, str(model), tmp_path / "data", dupe_factor=1)
    assert (tmp_path / "data" / "vocab.txt").read_bytes() == (model / "vocab.txt").read_bytes()
    plan = RunPlan.resolve(Config.load(data_dir=str(tmp_path / "data"), vocab_file=str(model), model_size="L2-H128",
                                       output_dir=str(tmp_path / "run")))
    assert plan.model_config.vocab_size == 1200
    with pytest.raises(UserInputError, match=f"Folder '{tmp_path}' holds no vocab.txt or tokenizer.json"):
        RunPlan.resolve(Config.load(data_dir=str(tmp_path / "data"), vocab_file=str(tmp_path), model_size="L2-H128"))


def test_a_marker_separated_corpus_gets_the_doc_separator_hint_and_its_held_out_share_explained(
        vocab, tmp_path, caplog):
    """A corpus of short poems between lines of ``%`` (a blank line only every 20 poems) read without
    --doc_separator: a few long documents, one held out (far more than eval_fraction's 1% of the text). Both are
    said, naming the fix; with ``--doc_separator %`` each poem is a document and neither is said."""
    import logging

    from tpu_pretrain.cli import main

    lines = [line.strip() for line in write_sample_corpus(tmp_path / "sample.txt", max_chars=30_000)
             .read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(lines) > 180
    poems = ["\n".join(lines[i:i + 3]) for i in range(0, 180, 3)]
    text = "".join(poem + ("\n%\n\n" if (n + 1) % 20 == 0 else "\n%\n") for n, poem in enumerate(poems))
    corpus = tmp_path / "poems.txt"
    corpus.write_text(text, encoding="utf-8")

    def create(out, *extra):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="tpu_pretrain"):
            assert main(["create-data", "--input", str(corpus), "--vocab_file", vocab, "--output_dir", str(out),
                         "--max_seq_length", "64", "--dupe_factor", "1", "--workers", "1", *extra]) == 0
        return " ".join(caplog.text.split())

    said = create(tmp_path / "guessed")
    assert ("The corpus was read as 3 document(s) (blank lines end a document), but the line '%' stands alone on 60 "
            "lines: if it separates documents, give --doc_separator %") in said, said
    assert "Held out for evaluation: 1 of 3 documents" in said and "eval_fraction=0.01 asks for 1.0%" in said
    assert "documents are held out whole, at random (and at least one)" in said

    said = create(tmp_path / "separated", "--doc_separator", "%", "--eval_fraction", "0.05")
    assert "60 documents" in said and "stands alone" not in said and "Held out for evaluation" not in said, said
