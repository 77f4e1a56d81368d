"""BLiMP by pseudo-log-likelihood on a small local subset of the real pairs (tests/export/blimp_subset, CC BY): through
``evaluate --blimp`` on a ModernBERT trained here (JAX backend), and on a random-init BERT of the TensorFlow backend,
each pair's verdict, and one hand-checked pair's scores, checked against transformers' model built from the export
(every token masked in turn, by hand); the Hub read behind a stand-in ``datasets``. Issue 44, item 4, through the
command line on the trained run: random inits of its shape scored beside it with their spread, progress as a bar
in a terminal (a pseudo-terminal here) and as a few log lines elsewhere, and one name per field."""

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
from terminal import run_in_terminal

from tpu_pretrain.cli import main
from tpu_pretrain.errors import UserInputError
from tpu_pretrain.export.blimp import (
    HUB_SOURCE,
    ScoringProgress,
    field_name,
    load_pairs,
    pseudo_log_likelihoods,
    scoring_model,
)
from tpu_pretrain.export.blimp_results import evaluate_blimp

SUBSET = Path(__file__).parent / "blimp_subset"
UIDS = 7
FIELDS = {"morphology", "syntax", "semantics", "syntax_semantics"}  # principle_A_case_2 writes syntax/semantics
RANDOM_INITS = 2
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
def modernbert_run(data, tmp_path_factory) -> tuple[Path, str, str]:
    """A ModernBERT trained for two steps, evaluated with ``--blimp`` on the subset (3 pairs a phenomenon, beside
    two random inits of its shape) and exported, through the command line in a process of its own (the JAX backend's
    Keras cannot share one with TensorFlow's, which this module loads), its output a pipe, not a terminal: the run
    folder, and what evaluate printed and logged."""
    run = str(tmp_path_factory.mktemp("blimp_run") / "run")
    commands = [["train", "--data_dir", data, "--output_dir", run, *TRAIN],
                ["evaluate", run, "--blimp", str(SUBSET), "--blimp_pairs", "3", "--blimp_random_inits",
                 str(RANDOM_INITS)], ["export", run]]
    script = textwrap.dedent(f"""
        import sys
        from tpu_pretrain.cli import main
        for command in {commands!r}:
            print("== " + command[0], flush=True)
            print("== " + command[0], file=sys.stderr, flush=True)
            assert main(command) == 0, command
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return Path(run), *(next(part for part in text.split("== ") if part.startswith("evaluate"))
                        for text in (done.stdout, done.stderr))


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
    run, printed, _ = modernbert_run
    result = json.loads((run / "blimp.json").read_text())
    assert f"of {result['pairs']} pairs right" in printed and "anaphor_gender_agreement" in printed
    assert "morphology" in printed and f"written to {run / 'blimp.json'}" in printed
    assert result["pairs"] == 3 * UIDS and len(result["by_phenomenon"]) == UIDS and result["skipped"] == 0
    assert result["step"] == 2 and result["source"] == str(SUBSET)
    assert set(result["by_field"]) == FIELDS
    assert sum(v["pairs"] for v in result["by_field"].values()) == result["pairs"]
    assert result["unk_share"] < 0.05 and result["ties"] == 0  # the sample corpus's vocab spells English
    assert 0 <= result["correct"] <= result["pairs"] and result["accuracy"] == result["correct"] / result["pairs"]
    pairs = load_pairs(SUBSET, 3)
    check_verdicts(result["by_phenomenon"], pairs, transformers_pll(run / "export" / "hf",
                                                                    [s for p in pairs for s in (p.good, p.bad)]))


def test_random_inits_of_the_run_s_shape_are_scored_beside_it_with_their_spread(modernbert_run):
    """--blimp_random_inits 2: each seed's accuracy, their mean, std and range (overall, per field, per phenomenon)
    in blimp.json and beside the model's figures, and whether the model lies outside them, said in words; no "from
    chance" reading of a distance from 0.5."""
    run, printed, _ = modernbert_run
    result = json.loads((run / "blimp.json").read_text())
    spread = result["random_inits"]
    accuracies = spread["accuracies"]
    assert spread["seeds"] == list(range(RANDOM_INITS)) and len(accuracies) == RANDOM_INITS
    assert all(a * result["pairs"] == pytest.approx(round(a * result["pairs"])) for a in accuracies)  # k of n right
    assert spread["mean"] == pytest.approx(np.mean(accuracies)) and spread["std"] == pytest.approx(np.std(accuracies,
                                                                                                          ddof=1))
    assert (spread["min"], spread["max"]) == (min(accuracies), max(accuracies))
    standing = "above" if result["accuracy"] > spread["max"] else "below" if result["accuracy"] < spread["min"] else (
        "within")
    assert spread["model_is"] == standing
    assert set(spread["by_field"]) == FIELDS and set(spread["by_phenomenon"]) == set(result["by_phenomenon"])
    for values in [*spread["by_field"].values(), *spread["by_phenomenon"].values()]:
        assert len(values["accuracies"]) == RANDOM_INITS and values["min"] <= values["mean"] <= values["max"]
    said = (f"random init of this shape, {RANDOM_INITS} seeds: mean {spread['mean']:.4f}, std {spread['std']:.4f}, "
            f"range {spread['min']:.4f}-{spread['max']:.4f}. The model's {result['accuracy']:.4f} is ")
    assert said + {"within": "INSIDE", "above": "OUTSIDE", "below": "OUTSIDE"}[standing] + " that spread" in printed
    field = spread["by_field"]["syntax_semantics"]
    assert f"random init {field['min']:.4f}-{field['max']:.4f}" in printed
    assert "from chance" not in printed and "chance 0.5" not in printed


def test_progress_in_a_log_is_a_few_lines_with_no_bar(modernbert_run):
    """Evaluate's output was a pipe: no bar redrawn into it, but the work announced, counted over the model and its
    random inits together, and its end said."""
    logged = modernbert_run[2]
    lines = [line for line in logged.splitlines() if "BLiMP" in line]
    assert lines[0].startswith(f"BLiMP: {3 * UIDS} pairs, ") and lines[0].endswith(
        f"masked copies for the model and as many for each of {RANDOM_INITS} random inits."), lines
    rows = int(lines[0].split(", ")[1].split()[0].replace(",", ""))
    total = rows * (1 + RANDOM_INITS)
    assert lines[-1].startswith(f"BLiMP scored: {total:,} of {total:,} masked copies scored (100%), "), lines
    assert len(lines) <= 4 and "\r" not in logged and "%|" not in logged, lines


def test_progress_in_a_terminal_is_one_bar_over_the_model_and_its_random_inits(modernbert_run, tmp_path):
    run = modernbert_run[0]
    code, shown = run_in_terminal([sys.executable, "-m", "tpu_pretrain", "evaluate", str(run), "--blimp", str(SUBSET),
                                   "--blimp_pairs", "1", "--blimp_random_inits", "2", "--output",
                                   str(tmp_path / "results")])
    assert code == 0, shown[-3000:]
    assert "BLiMP, the model" in shown and "BLiMP, random init 2 of 2" in shown and " masked" in shown, shown[-3000:]
    assert "100%|" in shown and "\r" in shown  # redrawn in place, and it reached the end
    assert "BLiMP scored:" not in shown  # the bar says it: no log line besides
    assert "random init of this shape, 2 seeds" in shown
    assert json.loads((tmp_path / "results" / "blimp.json").read_text())["pairs"] == UIDS


def test_a_log_line_comes_at_most_once_per_interval(caplog):
    """Where no bar is drawn (``terminal=False``): a line once the interval has passed, with the count, share and
    time left, and none before it; the closing line only once all is scored."""
    caplog.set_level(logging.INFO, logger="tpu_pretrain")
    quiet = ScoringProgress(10, "BLiMP, the model", terminal=False, every_s=3600)
    for _ in range(5):
        quiet.advance(1)
    quiet.close()
    assert "masked copies" not in caplog.text  # not all scored: no "scored" line either
    chatty = ScoringProgress(10, "BLiMP, random init 1 of 2", terminal=False, every_s=0)
    chatty.advance(3)
    assert "BLiMP, random init 1 of 2: 3 of 10 masked copies scored (30%), 0:00:00 spent, about 0:00:00 left" in (
        caplog.text)
    chatty.advance(7)
    chatty.close()
    assert "BLiMP scored: 10 of 10 masked copies scored (100%), 0:00:00 spent" in caplog.text


def test_random_inits_that_give_no_spread_or_have_no_blimp_are_refused(tmp_path, capsys):
    """One random init is one point, not a spread; a count without --blimp would be ignored: both refused with the
    fix, before any model is loaded (the run folder here does not even exist)."""
    assert main(["evaluate", str(tmp_path / "run"), "--blimp", str(SUBSET), "--blimp_random_inits", "1"]) == 2
    said = capsys.readouterr().err
    assert "--blimp_random_inits 1: give the number of random initialisations" in said and "2 or more" in said
    assert main(["evaluate", str(tmp_path / "run"), "--blimp_random_inits", "3"]) == 2
    assert "--blimp_random_inits 3 scores random inits on BLiMP, which is scored only with --blimp" in (
        capsys.readouterr().err)


def test_one_name_per_field(tmp_path):
    """BLiMP's principle_A_case_2 spells its field syntax/semantics, its 13 siblings syntax_semantics: read as one."""
    pairs = load_pairs(SUBSET)
    assert {p.field for p in pairs} == FIELDS
    assert {p.field for p in pairs if p.uid == "principle_A_case_2"} == {"syntax_semantics"}
    assert '"field": "syntax/semantics"' in (SUBSET / "principle_A_case_2.jsonl").read_text()  # the file unchanged
    assert [field_name(n) for n in ("syntax/semantics", "Syntax & Semantics", " morphology ")] == [
        "syntax_semantics", "syntax_semantics", "morphology"]


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
