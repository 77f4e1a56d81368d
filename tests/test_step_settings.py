"""Each subcommand offers exactly the settings its step uses: every flag changes the step's result, and a
setting the step would ignore is refused as an unknown flag."""

from __future__ import annotations

import hashlib
import json

import pytest

from tpu_pretrain.cli import main
from tpu_pretrain.config import CREATE_DATA, DATA, VOCAB, Config, pinned_settings, step_settings
from tpu_pretrain.data.create import create_pretraining_data
from tpu_pretrain.data.sample_corpus import write_sample_corpus
from tpu_pretrain.data.vocab import build_vocab

# Settings that say where (paths) or how fast (workers), not what: the same result by design.
WHERE_OR_HOW_FAST = {"input", "output_dir", "vocab_file", "workers", "runner", "beam_options"}

SPECIAL_LINES = [
    "A paragraph of three sentences. The second one is here! And a third one?",
    "Ｆｕｌｌｗｉｄｔｈ ＴＥＸＴ ｉｓ ｆｏｌｄｅｄ by NFKC alone.",
    "An escape sequence \x1b]0;ωtitle\x07 hides a title, and a bell\x07 rings.",
    "Punctuation; everywhere: really — truly!",
    "the repeated line zyxwvutsr zyxwvutsr zyxwvutsr",
    "the repeated line zyxwvutsr zyxwvutsr zyxwvutsr",
    "the repeated line zyxwvutsr zyxwvutsr zyxwvutsr",
    "A very long line with a rare letter ψ " + "and many words " * 20,
    "%",
    "A document after a percent line, with UPPER Case Words.",
    "北京大学的学生在图书馆里学习自然语言处理。我们喜欢中文句子。",
]

# For each setting, a value other than the baseline's that must change the result.
VOCAB_BASE = {"vocab_size": 1200, "num_unused_tokens": 10, "vocab_sample_lines": 300, "random_seed": 1}
VOCAB_CHANGES = {
    "doc_separator": "%", "unicode_normalization": "NFC", "strip_control": False, "strip_punctuation": True,
    "dedupe_lines": True, "max_line_length": 200, "vocab_size": 1300, "num_unused_tokens": 20,
    "vocab_sample_lines": 200, "sentencepiece_model_type": "unigram", "random_seed": 2, "do_lower_case": False,
    "encoding": "latin-1", "max_documents": 20, "max_bytes": 5000,
}
DATA_BASE = {"max_seq_length": 64, "max_predictions_per_seq": 9, "dupe_factor": 1, "eval_fraction": 0.1,
             "num_shards": 1, "random_seed": 1, "recipe": "classic"}  # NSP pairs: each packing setting changes them
DATA_CHANGES = {
    "doc_separator": "%", "split_sentences": True, "unicode_normalization": "NFC", "strip_control": False,
    "strip_punctuation": True, "dedupe_lines": True, "max_line_length": 200, "max_seq_length": 56,
    "max_predictions_per_seq": 8, "masked_lm_prob": 0.2, "dupe_factor": 2, "short_seq_prob": 0.5,
    "random_seed": 2, "do_lower_case": False, "do_whole_word_mask": True, "no_nsp": True,
    "chinese_whole_word": True, "num_shards": 2, "eval_fraction": 0.2, "encoding": "latin-1", "recipe": "modern",
    "eval_masked_lm_prob": 0.2, "pack_sequences": True, "max_documents": 20, "max_bytes": 5000,
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("settings")
    path = write_sample_corpus(root / "corpus.txt", max_chars=25_000)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("\n\n" + "\n".join(SPECIAL_LINES) + "\n")
    return str(path)


def digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_every_vocab_flag_changes_the_vocab(corpus, tmp_path):
    offered = set(step_settings(VOCAB)) - WHERE_OR_HOW_FAST
    assert offered == set(VOCAB_CHANGES), "a vocab setting without a check here (or a check without a setting)"

    def vocab(name, **changes):
        return digest(build_vocab(Config.load(input=[corpus], output_dir=str(tmp_path / name),
                                              **{**VOCAB_BASE, **changes})).path)

    base = vocab("base")
    same = [name for name, value in VOCAB_CHANGES.items() if vocab(name, **{name: value}) == base]
    assert not same, f"these vocab settings changed nothing: {same}"


def test_every_create_data_flag_changes_the_shards(corpus, tmp_path):
    offered = set(step_settings(CREATE_DATA)) - WHERE_OR_HOW_FAST
    assert offered == set(DATA_CHANGES), "a create-data setting without a check here (or a check without a setting)"
    assert set(pinned_settings(DATA)) <= offered  # every setting that shapes the data is offered
    vocab = build_vocab(Config.load(input=[corpus], output_dir=str(tmp_path), **VOCAB_BASE)).path

    def shards(name, **changes):
        manifest = create_pretraining_data(Config.load(
            input=[corpus], vocab_file=vocab, output_dir=str(tmp_path / name), workers=1, **{**DATA_BASE, **changes}))
        return json.dumps(sorted((s.file, s.sha256) for s in manifest.shards))

    base = shards("base")
    same = [name for name, value in DATA_CHANGES.items() if shards(name, **{name: value}) == base]
    assert not same, f"these create-data settings changed nothing: {same}"


@pytest.mark.parametrize("argv", [
    ["vocab", "--chinese_whole_word"],  # vocab has no word segmentation to do
    ["vocab", "--split_sentences"],  # the vocab sample is read line by line
    ["vocab", "--vocab_file", "vocab.txt"],  # vocab writes OUTPUT_DIR/vocab.txt; it never takes a file to replace
    ["create-data", "--max_position_embeddings", "512"],  # a property of the model, not of the data
    ["train", "--max_seq_length", "128"],  # read from the data
    ["train", "--max_predictions_per_seq", "20"],  # read from the data
], ids=lambda argv: " ".join(argv))
def test_a_setting_a_step_ignores_is_not_offered(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert f"unrecognized arguments: {argv[1]}" in capsys.readouterr().err
