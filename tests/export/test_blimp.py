"""BLiMP by pseudo-log-likelihood on a small local subset of the real pairs (tests/export/blimp_subset, CC BY): through
``evaluate --blimp`` on a ModernBERT trained here (JAX backend), and on a random-init BERT of the TensorFlow backend,
each pair's verdict, and one hand-checked pair's scores, checked against transformers' model built from the export
(every token masked in turn, by hand); the Hub read behind a stand-in ``datasets``."""

import dataclasses
import json
import logging
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest
from fault_injection import ENV, sample_data

from tpu_pretrain.errors import UserInputError
from tpu_pretrain.export.blimp import HUB_SOURCE, evaluate_blimp, load_pairs, pseudo_log_likelihoods, scoring_model

SUBSET = Path(__file__).parent / "blimp_subset"
UIDS = 6
PAIR = ("Katherine can't help herself.", "Katherine can't help himself.")  # anaphor_gender_agreement, pair 0


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """MLM-only data of the sample corpus (English docstrings), which both families train on."""
    root = tmp_path_factory.mktemp("blimp")
    return sample_data(root, max_chars=30_000, num_shards=1, workers=1, vocab_size=1200, recipe="modern",
                       eval_fraction=0.05)


TRAIN = ["--backend", "jax", "--model_family", "modernbert", "--model_size", "L2-H128", "--train_batch_size", "8",
         "--num_train_steps", "2", "--num_warmup_steps", "1", "--learning_rate", "2e-3", "--save_checkpoints_steps",
         "2", "--eval_every_steps", "0", "--max_eval_steps", "1", "--steps_per_execution", "2", "--session_hours", "-1"]


@pytest.fixture(scope="module")
def modernbert_run(data, tmp_path_factory) -> tuple[Path, str]:
    """A ModernBERT trained for two steps, evaluated with ``--blimp`` on the subset (3 pairs a phenomenon) and
    exported, through the command line in a process of its own (the JAX backend's Keras cannot share one with
    TensorFlow's, which this module loads): the run folder and what evaluate printed."""
    run = str(tmp_path_factory.mktemp("blimp_run") / "run")
    commands = [["train", "--data_dir", data, "--output_dir", run, *TRAIN],
                ["evaluate", run, "--blimp", str(SUBSET), "--blimp_pairs", "3"], ["export", run]]
    script = textwrap.dedent(f"""
        from tpu_pretrain.cli import main
        for command in {commands!r}:
            print("== " + command[0], flush=True)
            assert main(command) == 0, command
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return Path(run), next(part for part in done.stdout.split("== ") if part.startswith("evaluate"))


@pytest.fixture(scope="module")
def random_bert(data, tmp_path_factory):
    """A BERT L2-H128 of the data's vocab from random initialisation on the TensorFlow backend, and its export."""
    from tpu_pretrain.data.vocab import load_vocab
    from tpu_pretrain.export.rebuild import TrainedModel
    from tpu_pretrain.export.writers import export_huggingface
    from tpu_pretrain.models.bert_config import bert_config_for_size
    from tpu_pretrain.tf_backend.inference import TfInference

    vocab = str(Path(data).parent / "vocab.txt")
    model = TfInference.build(bert_config_for_size("L2-H128", len(load_vocab(vocab))), 64, 10, False, seed=7)
    folder = export_huggingface(model, tmp_path_factory.mktemp("random_bert") / "hf", vocab, heads="mlm")
    return TrainedModel(model, vocab, True, "random initialisation"), folder


def transformers_pll(folder: Path, sentences) -> np.ndarray:
    """Each sentence's pseudo-log-likelihood by transformers' own model and tokenizer of an exported folder: a copy
    of the sentence per token with that token masked, log-softmax, the true token's value summed."""
    import torch
    import transformers

    model = transformers.AutoModelForMaskedLM.from_pretrained(folder).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    scores, threads = [], torch.get_num_threads()
    torch.set_num_threads(1)  # beside TensorFlow's threads on a small machine, more is many times slower
    try:
        for text in sentences:
            ids = tokenizer(text)["input_ids"]
            copies = torch.tensor([ids[:i] + [tokenizer.mask_token_id] + ids[i + 1:] for i in range(1, len(ids) - 1)])
            with torch.no_grad():
                logp = torch.log_softmax(model(input_ids=copies).logits.double(), dim=-1)
            scores.append(float(sum(logp[n, n + 1, ids[n + 1]] for n in range(len(copies)))))
    finally:
        torch.set_num_threads(threads)
    return np.array(scores)


def check_verdicts(by_phenomenon: dict, pairs, expected: np.ndarray) -> None:
    """Right per phenomenon as transformers' scores say (pairs its scores cannot separate are not counted on)."""
    good, bad = expected[0::2], expected[1::2]
    clear = np.abs(good - bad) > 1e-3
    assert clear.mean() > 0.8
    for uid, values in by_phenomenon.items():
        mine = [n for n, p in enumerate(pairs) if p.uid == uid]
        assert values["pairs"] == len(mine), uid
        if clear[mine].all():
            assert values["correct"] == int(np.sum(good[mine] > bad[mine])), uid


def test_blimp_through_the_command_line_on_a_trained_modernbert_agrees_with_transformers(modernbert_run):
    run, printed = modernbert_run
    result = json.loads((run / "blimp.json").read_text())
    assert f"of {result['pairs']} pairs right" in printed and "anaphor_gender_agreement" in printed
    assert "morphology" in printed and f"written to {run / 'blimp.json'}" in printed
    assert result["pairs"] == 3 * UIDS and len(result["by_phenomenon"]) == UIDS and result["skipped"] == 0
    assert result["step"] == 2 and result["source"] == str(SUBSET)
    assert set(result["by_field"]) == {"morphology", "syntax", "semantics", "syntax_semantics"}
    assert sum(v["pairs"] for v in result["by_field"].values()) == result["pairs"]
    assert result["unk_share"] < 0.05 and result["ties"] == 0  # the sample corpus's vocab spells English
    assert 0 <= result["correct"] <= result["pairs"] and result["accuracy"] == result["correct"] / result["pairs"]
    pairs = load_pairs(SUBSET, 3)
    check_verdicts(result["by_phenomenon"], pairs, transformers_pll(run / "export" / "hf",
                                                                    [s for p in pairs for s in (p.good, p.bad)]))


def test_a_hand_checked_pair_scores_as_transformers_scores_it_on_the_tensorflow_backend(random_bert):
    from tpu_pretrain.data.tokenization import load_tokenizer

    trained, folder = random_bert
    pairs = load_pairs(SUBSET, 3)
    expected = transformers_pll(folder, [s for p in pairs for s in (p.good, p.bad)])
    tokenizer = load_tokenizer(trained.vocab_file, trained.do_lower_case)
    ids = [[tokenizer.cls_id, *tokenizer.encode(s), tokenizer.sep_id] for s in PAIR]
    assert ids[0] != ids[1]
    ours = pseudo_log_likelihoods(scoring_model(trained, 16), ids, tokenizer.mask_id, batch_rows=8)
    print(f"{PAIR}: PLL {ours} here, {expected[:2]} by transformers")
    assert np.allclose(ours, expected[:2], rtol=0, atol=1e-3) and abs(ours[0] - ours[1]) > 1e-3
    result = evaluate_blimp(trained, pairs, str(SUBSET))
    assert result.pairs == 3 * UIDS
    check_verdicts(result.by_phenomenon, pairs, expected)


def test_a_vocab_that_cannot_spell_english_is_warned_about_and_its_pairs_are_ties(random_bert, tmp_path, caplog):
    trained = random_bert[0]
    tokens = Path(trained.vocab_file).read_text(encoding="utf-8").splitlines()
    alien = tmp_path / "vocab.txt"  # the same size; only the special tokens left
    alien.write_text("".join(t + "\n" if t.startswith("[") else f"\u0416{n}\n" for n, t in enumerate(tokens)),
                     encoding="utf-8")
    caplog.set_level(logging.WARNING, logger="tpu_pretrain")
    result = evaluate_blimp(dataclasses.replace(trained, vocab_file=str(alien)), load_pairs(SUBSET, 1),
                            output=tmp_path / "blimp.json")
    assert "[UNK]: BLiMP is English" in caplog.text and result.unk_share == 1.0
    assert result.ties == UIDS and result.correct == 0 and result.accuracy == 0.0
    assert json.loads((tmp_path / "blimp.json").read_text())["ties"] == UIDS


def test_the_local_copy_is_read_and_bad_lines_are_named(tmp_path):
    pairs = load_pairs(SUBSET)
    assert len(pairs) == 4 * UIDS and (pairs[0].good, pairs[0].bad) == PAIR
    assert pairs[0].field == "morphology" and pairs[0].term == "anaphor_agreement"
    one = load_pairs(SUBSET / "npi_present_1.jsonl", 2)
    assert [p.uid for p in one] == ["npi_present_1"] * 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text((SUBSET / "npi_present_1.jsonl").read_text().splitlines()[0] + "\n{\"sentence_good\": \"A.\"}\n")
    with pytest.raises(UserInputError, match=r"bad.jsonl, line 2: .*sentence_bad, UID missing"):
        load_pairs(bad)
    bad.write_text("not json\n")
    with pytest.raises(UserInputError, match=r"bad.jsonl, line 1: not JSON"):
        load_pairs(bad)
    with pytest.raises(UserInputError, match="does not exist"):
        load_pairs(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserInputError, match="no .jsonl files"):
        load_pairs(tmp_path / "empty")
    with pytest.raises(UserInputError, match="--blimp_pairs 0"):
        load_pairs(SUBSET, 0)


def test_the_hub_is_read_per_phenomenon_through_datasets(monkeypatch):
    """The Hub stand-in serves the local subset as nyu-mll/blimp's configs: one per UID, the split sliced."""
    rows = {f.stem: [json.loads(line) for line in f.read_text().splitlines()] for f in sorted(SUBSET.glob("*.jsonl"))}
    calls = []

    def load_dataset(name, config, split):
        calls.append((name, config, split))
        assert name == "nyu-mll/blimp" and split == "train[:2]"
        return rows[config][:2]

    fake = types.SimpleNamespace(get_dataset_config_names=lambda name: sorted(rows), load_dataset=load_dataset)
    monkeypatch.setitem(sys.modules, "datasets", fake)
    pairs = load_pairs(HUB_SOURCE, 2)
    assert len(pairs) == 2 * UIDS and len(calls) == UIDS and pairs[0].good == PAIR[0]

    def offline(name):
        raise ConnectionError("no network")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(get_dataset_config_names=offline))
    with pytest.raises(UserInputError, match=r"Could not read nyu-mll/blimp .*pass --blimp PATH"):
        load_pairs(HUB_SOURCE)
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(UserInputError, match="pip install datasets, or pass --blimp PATH"):
        load_pairs(HUB_SOURCE)
