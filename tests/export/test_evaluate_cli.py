"""``evaluate``'s command line at its edges (issue 45): a full disk, BLiMP files that are not plain UTF-8, a BLiMP
setting without BLiMP, and where ``--output NAME`` puts the results. The model is a tiny BERT in a transformers
folder (one layer, 32 wide: seconds to score), which evaluate reads as a released checkpoint."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SUBSET = Path(__file__).parent / "blimp_subset"
WORDS = ("the a an is was of to and in that it he she his her him himself herself can can't help not who what there "
         "are were be . , '").split()


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    """A transformers BertForMaskedLM folder with its vocab.txt: what evaluate reads without a run folder."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("tiny_bert")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    transformers.BertForMaskedLM(config).save_pretrained(folder)
    return folder


def evaluate_cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpu_pretrain", "evaluate", *map(str, args)], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def refusal(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("tpu-pretrain evaluate: error: "), done.stderr
    return lines[-1]


def test_results_onto_a_full_disk_are_one_line(tiny_bert, mount_tmpfs):
    """Item 9: the disk found full only by writing evaluation.json: one line naming it, nothing left there."""
    full = mount_tmpfs("full", size="64k", full=True)
    said = refusal(evaluate_cli(tiny_bert, "--sentence", "he can help [MASK] .", "--output", full / "eval.json"))
    assert f"The disk under {full} is full (No space left on device): {full / 'eval.json'} was not written" in said
    assert sorted(p.name for p in full.iterdir()) == ["filler"]


def test_a_latin_1_blimp_file_is_named_with_the_fix(tiny_bert, tmp_path):
    """Item 10: not a UnicodeDecodeError traceback, but the file, the line and how to convert it."""
    latin = tmp_path / "latin.jsonl"
    row = {"sentence_good": "The café is open.", "sentence_bad": "The café are open.", "UID": "agreement"}
    latin.write_bytes((json.dumps(row) + "\n").encode("utf-8") + json.dumps(row, ensure_ascii=False).encode("latin-1"))
    said = refusal(evaluate_cli(tiny_bert, "--blimp", latin))
    assert f"{latin}, line 2: not UTF-8 text (byte 0xe9)" in said and "iconv -f latin1 -t utf-8" in said


def test_a_blimp_file_with_a_byte_order_mark_is_read(tiny_bert, tmp_path):
    """Item 17: a UTF-8 .jsonl saved with a byte-order mark (as some editors do) is read, as corpus files are."""
    marked = tmp_path / "marked.jsonl"
    marked.write_text((SUBSET / "npi_present_1.jsonl").read_text(encoding="utf-8"), encoding="utf-8-sig")
    done = evaluate_cli(tiny_bert, "--blimp", marked, "--blimp_pairs", "2", "--output", tmp_path / "results")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((tmp_path / "results" / "blimp.json").read_text())["pairs"] == 2


def test_blimp_pairs_without_blimp_is_refused(tiny_bert, tmp_path):
    """Item 17: --blimp_pairs alone would be ignored in silence; it is refused before the model loads."""
    said = refusal(evaluate_cli(tiny_bert, "--blimp_pairs", "3", "--output", tmp_path / "results"))
    assert "--blimp_pairs 3 counts BLiMP's pairs, and BLiMP is scored only with --blimp" in said
    assert not (tmp_path / "results").exists()


def test_output_name_is_a_folder_holding_both_results(tiny_bert, tmp_path):
    """Item 17: --output NAME (new, no .json) is a folder with evaluation.json and blimp.json, nothing in the current
    folder; NAME.json is a file with blimp.json beside it; a file of another kind is left alone and refused."""
    work = tmp_path / "work"
    work.mkdir()
    done = evaluate_cli(tiny_bert, "--blimp", SUBSET / "npi_present_1.jsonl", "--blimp_pairs", "2", "--output",
                        "results", cwd=work)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in work.iterdir()) == ["results"]
    assert sorted(p.name for p in (work / "results").iterdir()) == ["blimp.json", "evaluation.json"]
    done = evaluate_cli(tiny_bert, "--sentence", "he can help [MASK] .", "--output", work / "step.json")
    assert done.returncode == 0 and (work / "step.json").is_file(), done.stdout + done.stderr
    (work / "notes").write_text("mine")
    said = refusal(evaluate_cli(tiny_bert, "--output", work / "notes"))
    assert f"--output {work / 'notes'} is a file, not a results .json" in said
    assert (work / "notes").read_text() == "mine"
