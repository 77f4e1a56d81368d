"""Parquet tables and Hub datasets as corpus input, read by the real code: a local folder laid out as the Hub
(``TPU_PRETRAIN_HUB_MIRROR``, the one thing that stands in for the Hub's filesystem), made here with pyarrow.

A row is a document and the lines of its text its sentences, so the same text given as rows (a local parquet
file, a Hub dataset's split) or as a text file (blank lines between documents) gives byte-identical shards."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tpu_pretrain.config import Config
from tpu_pretrain.data.corpus import CorpusReader
from tpu_pretrain.data.create import create_pretraining_data
from tpu_pretrain.data.hub_datasets import parse_hub_url
from tpu_pretrain.data.sample_corpus import documents
from tpu_pretrain.data.vocab import build_vocab
from tpu_pretrain.errors import UserInputError

DATASET = "hf://datasets/owner/docs"
SECRET = "hf_NeverPrintThisToken123"
SETTINGS = {"max_seq_length": 64, "max_predictions_per_seq": 10, "dupe_factor": 2, "num_shards": 2,
            "eval_fraction": 0.05}


def _write(path, table, **kwargs):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, **kwargs)


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    """The sample corpus as a text file, one local parquet file, and a mirror of a few Hub dataset layouts."""
    root = tmp_path_factory.mktemp("hub")
    rows = ["\n".join(doc) for doc in documents(60_000)]
    (root / "corpus.txt").write_text("\n\n".join(rows) + "\n", encoding="utf-8")
    _write(root / "local" / "docs.parquet", pa.table({"id": range(len(rows)), "body": rows}), row_group_size=16)
    hub = root / "mirror" / "datasets" / "owner"
    half = len(rows) // 2
    for n, part in enumerate((rows[:half], rows[half:])):  # data/SPLIT-0000N-of-00002.parquet, small row groups
        _write(hub / "docs" / "data" / f"train-0000{n}-of-00002.parquet",
               pa.table({"text": part, "url": [f"u{i}" for i in range(len(part))]}), row_group_size=9)
    _write(hub / "docs" / "data" / "test-00000-of-00001.parquet", pa.table({"text": pa.array([], pa.string())}))
    for config in ("en", "fr"):  # CONFIG/SPLIT-*.parquet, as wikimedia/wikipedia
        _write(hub / "multi" / config / "train-00000-of-00001.parquet", pa.table({"text": rows[:5]}))
    (hub / "scripted").mkdir()  # no parquet in the repository: the Hub's conversion CONFIG/SPLIT/0000.parquet
    (hub / "scripted" / "README.md").write_text("a dataset with a loading script")
    _write(hub / "scripted@refs%2Fconvert%2Fparquet" / "default" / "train" / "0000.parquet",
           pa.table({"text": rows}))
    card = ("---\nlicense: mit\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: "
            "data/*/*\n- config_name: sample-10BT\n  data_files:\n  - split: train\n    path: sample/10BT/*\n"
            "---\n# Card\n")
    (hub / "carded").mkdir()  # a dataset card's configs name the files (as HuggingFaceFW/fineweb's)
    (hub / "carded" / "README.md").write_text(card)
    _write(hub / "carded" / "sample" / "10BT" / "000_00000.parquet", pa.table({"text": rows[:half]}))
    _write(hub / "carded" / "sample" / "10BT" / "001_00000.parquet", pa.table({"text": rows[half:]}))
    _write(hub / "carded" / "data" / "CC-MAIN-1" / "000_00000.parquet", pa.table({"text": rows[:2]}))
    _write(hub / "unnamed" / "000_00000.parquet", pa.table({"text": rows}))  # no split in any name: all train
    _write(hub / "broken" / "data" / "train-00000-of-00002.parquet", pa.table({"text": rows[:3]}))
    (hub / "broken" / "data" / "train-00001-of-00002.parquet").write_bytes(b"PAR1 not really parquet")
    _write(hub / "nocolumn" / "data" / "train-00000-of-00001.parquet",
           pa.table({"title": rows[:3], "body": rows[:3], "n": [1, 2, 3]}))
    return root


@pytest.fixture
def mirror(layout, monkeypatch):
    monkeypatch.setenv("TPU_PRETRAIN_HUB_MIRROR", str(layout / "mirror"))
    monkeypatch.setenv("HF_TOKEN", SECRET)
    return layout


def _documents(inputs, **settings):
    reader = CorpusReader(inputs, Config.load(input=inputs, **settings).corpus)
    return list(reader.documents()), reader


def test_rows_are_documents_as_blank_line_separated_text_is(mirror):
    text, _ = _documents([str(mirror / "corpus.txt")])
    local, reader = _documents([str(mirror / "local" / "*.parquet?column=body")])
    hub, hub_reader = _documents([f"{DATASET}?split=train"])
    converted, _ = _documents(["hf://datasets/owner/scripted"])
    carded, _ = _documents(["hf://datasets/owner/carded/sample-10BT"])
    unnamed, _ = _documents(["hf://datasets/owner/unnamed"])
    assert len(text) > 100 and local == text and hub == text and converted == text and carded == text
    assert unnamed == text and len(_documents(["hf://datasets/owner/carded"])[0]) == 2  # the card's default
    assert reader.rows_read == [len(text)] and hub_reader.rows_read == [len(text) // 2, len(text) - len(text) // 2]
    assert hub_reader.files[0] == f"{DATASET}/data/train-00000-of-00002.parquet"
    assert f"{len(text)} rows" in hub_reader.stats.report()


def test_a_null_or_blank_row_is_counted_and_located_and_blank_lines_inside_a_row_do_not_split_it(tmp_path):
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"text": ["One.\n\nTwo.", None, "  \n ", "Three."]}), path)
    docs, reader = _documents([str(path)])
    assert docs == [["One.", "Two."], ["Three."]]
    assert f"2 empty or null rows (first at {path} row 1, {path} row 2)" in reader.stats.report()


def test_max_documents_and_max_bytes_stop_at_a_document_end(mirror):
    docs, reader = _documents([f"{DATASET}"], max_documents=7)
    assert len(docs) == 7 and reader.rows_read == [7, 0]
    everything, _ = _documents([str(mirror / "corpus.txt")])
    some, _ = _documents([str(mirror / "corpus.txt")], max_bytes=2000)
    assert some == everything[:len(some)] and 1 <= len(some) < 20


@pytest.fixture(scope="module")
def vocab(layout, tmp_path_factory):
    """A vocab built from the Hub dataset: vocab reads hf:// inputs too."""
    os.environ["TPU_PRETRAIN_HUB_MIRROR"] = str(layout / "mirror")
    try:
        return build_vocab(Config.load(input=[DATASET], vocab_size=1500, num_unused_tokens=5,
                                       output_dir=str(tmp_path_factory.mktemp("vocab")))).path
    finally:
        del os.environ["TPU_PRETRAIN_HUB_MIRROR"]


def _digests(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.tfrecord"))}


def test_create_data_from_the_hub_and_from_parquet_writes_the_text_files_shards(mirror, vocab, tmp_path):
    def make(name, inputs):
        create_pretraining_data(Config.load(input=inputs, vocab_file=vocab, output_dir=str(tmp_path / name),
                                            workers=1, **SETTINGS))
        return _digests(tmp_path / name)

    text = make("text", [str(mirror / "corpus.txt")])
    assert len(text) == 3 and make("parquet", [str(mirror / "local" / "docs.parquet?column=body")]) == text
    flags = [f"--{key}={value}" for key, value in SETTINGS.items()]
    done = subprocess.run([sys.executable, "-m", "tpu_pretrain", "create-data", "--input", f"{DATASET}?split=train",
                           "--vocab_file", vocab, "--output_dir", str(tmp_path / "hub"), "--workers=2", *flags],
                          capture_output=True, text=True, timeout=300, env=os.environ.copy())
    assert done.returncode == 0, done.stderr[-3000:]
    assert _digests(tmp_path / "hub") == text
    manifest = (tmp_path / "hub" / "manifest.json").read_text()
    inputs = json.loads(manifest)["inputs"]
    assert [(i["dataset"], i["config"], i["split"], i["column"], i["revision"]) for i in inputs] == \
        [("owner/docs", "default", "train", "text", None)] * 2
    assert sum(i["rows"] for i in inputs) == len(documents(60_000)) and all(len(i["sha256"]) == 64 for i in inputs)
    assert SECRET not in manifest + done.stdout + done.stderr


def test_the_beam_runner_reads_a_hub_dataset_as_the_local_path_does(mirror, vocab, tmp_path):
    pytest.importorskip("apache_beam", reason="the beam extra is not installed")
    local = create_pretraining_data(Config.load(input=[DATASET], vocab_file=vocab, output_dir=str(tmp_path / "local"),
                                                workers=1, **SETTINGS))
    flags = [f"--{key}={value}" for key, value in SETTINGS.items()]
    done = subprocess.run([sys.executable, "-m", "tpu_pretrain", "create-data", "--runner", "DirectRunner", "--input",
                           DATASET, "--vocab_file", vocab, "--output_dir", str(tmp_path / "beam"), *flags],
                          capture_output=True, text=True, timeout=600, env=os.environ.copy())
    assert done.returncode == 0, done.stderr[-3000:]
    assert local.totals("train")["instances"] > 0
    assert _digests(tmp_path / "beam") == _digests(tmp_path / "local")
    inputs = json.loads((tmp_path / "beam" / "manifest.json").read_text())["inputs"]
    assert {(i["dataset"], i["split"]) for i in inputs} == {("owner/docs", "train")}
    assert SECRET not in done.stdout + done.stderr


@pytest.mark.parametrize("url, message", [
    (f"{DATASET}?split=validation", "Dataset owner/docs has no split 'validation' in config 'default' .*splits there: "
                                    "test, train"),
    (f"{DATASET}?split=test", r"Dataset owner/docs, split 'test' is empty: its file\(s\) hf://datasets/owner/docs/"
                              "data/test-00000-of-00001.parquet hold no rows"),
    (f"{DATASET}?column=body", "Dataset owner/docs, file hf://datasets/owner/docs/data/train-00000-of-00002.parquet "
                               r"has no column 'body' \(its columns: text, url\)"),
    ("hf://datasets/owner/nocolumn", r"file .*nocolumn/data/train-00000-of-00001.parquet has no 'text' column and 2 "
                                     r"text columns \(title, body; .*\?column=NAME"),
    ("hf://datasets/owner/nocolumn?column=n", "column 'n' holds int64, not text"),
    ("hf://datasets/owner/broken", "Dataset owner/broken, file hf://datasets/owner/broken/data/"
                                   "train-00001-of-00002.parquet is not a readable parquet file"),
    ("hf://datasets/owner/multi", r"several configs: name one as hf://datasets/owner/multi/CONFIG \(configs: en, fr\)"),
    ("hf://datasets/owner/multi/de", r"no config 'de' \(configs: en, fr\)"),
    ("hf://datasets/owner/carded/other", r"no config 'other' \(configs: default, sample-10BT\)"),
    ("hf://datasets/owner/carded?split=test", r"no split 'test' in config 'default' \(splits there: train\)"),
    ("hf://datasets/owner/absent", "Dataset owner/absent .*is not in the mirror"),
    ("hf://datasets/owner", "is not a Hub dataset: write hf://datasets/OWNER/NAME"),
])
def test_a_bad_dataset_is_refused_naming_the_dataset_and_file(mirror, url, message):
    with pytest.raises(UserInputError, match=message):
        CorpusReader([url], Config().corpus)


def test_a_malformed_local_parquet_file_is_refused_before_work_starts(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1" + b"\0" * 100)
    with pytest.raises(UserInputError, match=f"Corpus file {bad} is not a readable parquet file"):
        CorpusReader([str(tmp_path)], Config().corpus)


def test_the_hub_address_reads_as_documented():
    spec = parse_hub_url("hf://datasets/wikimedia/wikipedia@main/20231101.zh?split=train&column=text")
    assert (spec.repo, spec.revision, spec.config, spec.split, spec.column) == \
        ("wikimedia/wikipedia", "main", "20231101.zh", "train", "text")
    assert parse_hub_url("hf://datasets/o/n").split == "train"


def test_an_unreachable_hub_is_a_message_not_a_traceback(tmp_path):
    """Issue 37, item 9: the Hub's client raises its HTTP library's ConnectError, which is no OSError."""
    from storage_emulator import free_port

    env = {k: v for k, v in os.environ.items() if k != "TPU_PRETRAIN_HUB_MIRROR"}
    env["HF_ENDPOINT"] = f"http://127.0.0.1:{free_port()}"  # nothing listens there: the connection is refused
    done = subprocess.run([sys.executable, "-m", "tpu_pretrain", "vocab", "--input", "hf://datasets/owner/docs",
                           "--output_dir", str(tmp_path / "v")], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "The Hub could not be reached for dataset owner/docs (ConnectError" in done.stderr
    assert "check the connection" in done.stderr and "Traceback" not in done.stderr
