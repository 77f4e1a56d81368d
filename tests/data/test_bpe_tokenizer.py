"""create-data with a Hugging Face ``tokenizer.json`` (byte-level BPE, laid out as ModernBERT's) as vocab_file: the
shards' ids decode back to the corpus, masking never picks or draws a special or added token, whole-word masking
keeps a word's BPE pieces together, and a file without the special tokens or without valid JSON is refused by name."""

import json
import shutil
import unicodedata

import numpy as np
import pytest
from bpe_tokenizer import train_bpe_tokenizer
from corpora import WIKITEXT, needs_corpora

from tpu_pretrain.config import Config
from tpu_pretrain.data.create import create_pretraining_data
from tpu_pretrain.data.data_folder import read_data_info, sha256_file
from tpu_pretrain.data.tfrecord import decode_example, read_records
from tpu_pretrain.data.tokenization import load_tokenizer
from tpu_pretrain.data.vocab import load_vocab, replacement_ids
from tpu_pretrain.errors import UserInputError

pytestmark = needs_corpora
SEQ = 64


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A model folder holding a BPE tokenizer.json, and whole-word-masked MLM-only data made with that folder."""
    root = tmp_path_factory.mktemp("bpe")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(WIKITEXT.read_text(encoding="utf-8").splitlines()[:1500]), encoding="utf-8")
    train_bpe_tokenizer(root / "model" / "tokenizer.json", WIKITEXT)
    create_pretraining_data(Config.load(input=[str(corpus)], vocab_file=str(root / "model"), recipe="modern",
                                        do_whole_word_mask=True, output_dir=str(root / "data"), max_seq_length=SEQ,
                                        dupe_factor=1, num_shards=1, eval_fraction=0.05, workers=1))
    return root


def records(data_dir):
    return [decode_example(r) for r in read_records(data_dir / "train-00000-of-00001.tfrecord")]


def test_the_tokenizer_is_the_files_own_with_its_special_ids(made):
    tokenizer = load_tokenizer(str(made / "model" / "tokenizer.json"))
    assert (tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id, tokenizer.mask_id) == tuple(
        range(2000, 2005))  # at the end, as ModernBERT's 50280-50284
    assert tokenizer.vocab_size == 2005 and tokenizer.inv_vocab[0] == "|||IP_ADDRESS|||"
    text = "The unbelievable fox, [MASK] jumped."
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text and tokenizer.mask_id not in ids  # a typed [MASK] is text in the corpus
    flags = dict(zip(tokenizer.tokenize(text), tokenizer.word_continuations(np.asarray(ids)), strict=True))
    assert not flags["T"] and flags["he"]  # the first piece starts a word though it has no Ġ
    assert not flags["Ġun"] and flags["able"] and not flags[","]
    drawn = set(replacement_ids(tokenizer.inv_vocab))
    assert not drawn & {0, 1, *range(2000, 2005)} and len(drawn) == 2005 - 7  # added and special tokens never


def test_data_folder_keeps_the_tokenizer_and_its_checksum(made):
    info = read_data_info(str(made / "data"))
    assert info.vocab_file == str(made / "data" / "tokenizer.json") and not (made / "data" / "vocab.txt").exists()
    assert info.vocab_sha256 == sha256_file(made / "model" / "tokenizer.json") and info.vocab_size == 2005
    assert info.settings["do_lower_case"] is False  # casing is the tokenizer's normaliser's
    assert load_vocab(info.vocab_file) == load_vocab(made / "model")


def test_shards_decode_to_the_corpus_and_mask_whole_words_never_special_tokens(made):
    tokenizer = load_tokenizer(str(made / "data" / "tokenizer.json"))
    corpus = "".join(unicodedata.normalize("NFKC", (made / "corpus.txt").read_text(encoding="utf-8")).split())
    specials, added = set(tokenizer.special_ids.values()), tokenizer.inv_vocab.added_ids
    masked = violations = grouped = 0
    for example in records(made / "data"):
        ids, weights = example["input_ids"].copy(), example["masked_lm_weights"]
        positions = example["masked_lm_positions"][weights > 0]
        originals = example["masked_lm_ids"][weights > 0]
        shown = ids[positions]
        assert not set(originals) & (specials | added)  # never masks [CLS]/[SEP] or another special token
        replaced = shown[(shown != tokenizer.mask_id) & (shown != originals)]
        assert not set(replaced) & (specials | added)  # nor draws one as the "random token"
        ids[positions] = originals
        real = ids[:int(example["input_mask"].sum())]
        assert real[0] == tokenizer.cls_id and real[-1] == tokenizer.sep_id
        for piece in np.split(real, np.flatnonzero(real == tokenizer.sep_id) + 1):
            text = tokenizer.decode(piece[(piece != tokenizer.cls_id) & (piece != tokenizer.sep_id)])
            assert "".join(text.split()) in corpus, text
        is_masked = np.zeros(len(ids), bool)
        is_masked[positions] = True
        for p in positions:
            nxt = ids[p + 1] if p + 1 < len(real) else tokenizer.sep_id
            word_goes_on = tokenizer.is_continuation[nxt]
            punctuation = not any(ch.isalnum() for ch in tokenizer.inv_vocab[ids[p]])
            if word_goes_on and not punctuation:
                violations += not is_masked[p + 1]
                grouped += bool(is_masked[p + 1])
        masked += len(positions)
    print(f"{masked} masked tokens; {grouped} followed by a masked piece of their word, {violations} not")
    assert grouped > masked // 20 and violations <= masked // 100  # the exceptions: a sentence's first piece


@pytest.mark.parametrize("damage", ["missing [MASK]", "broken JSON"])
def test_a_tokenizer_file_without_the_special_tokens_or_not_json_is_refused_naming_it(made, tmp_path, damage):
    bad = tmp_path / "bad" / "tokenizer.json"
    bad.parent.mkdir()
    if damage == "broken JSON":
        bad.write_text((made / "model" / "tokenizer.json").read_text()[:500])
        expected = rf"Tokenizer file '{bad}' is not valid JSON"
    else:
        spec = json.loads((made / "model" / "tokenizer.json").read_text())
        spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] != "[MASK]"]
        bad.write_text(json.dumps(spec))
        expected = rf"Tokenizer file {bad} lacks the special token\(s\) \[MASK\]"
    for vocab_file in (bad, bad.parent):
        with pytest.raises(UserInputError, match=expected):
            create_pretraining_data(Config.load(input=[str(made / "corpus.txt")], vocab_file=str(vocab_file),
                                                output_dir=str(tmp_path / "data")))


def test_bert_refuses_a_tokenizer_json_and_modernbert_takes_its_ids(made, tmp_path):
    from tpu_pretrain.core.resolve import run_model_config
    from tpu_pretrain.data.vocab import Vocab

    data = read_data_info(str(made / "data"))
    vocab = Vocab.read(data.vocab_file)
    with pytest.raises(UserInputError, match="is a tokenizer.json, which only --model_family modernbert trains"):
        run_model_config(Config.load(data_dir=str(made / "data"), model_size="tiny"), data, vocab)
    config = run_model_config(Config.load(data_dir=str(made / "data"), model_size="tiny",
                                          model_family="modernbert"), data, vocab)
    assert config.vocab_size == 2048  # 2005 tokens, padded to a multiple of 64 as the released models are
    assert (config.pad_token_id, config.cls_token_id, config.sep_token_id, config.mask_token_id) == (
        2003, 2001, 2002, 2004)
    shutil.copytree(made / "data", tmp_path / "data")
    (tmp_path / "data" / "tokenizer.json").write_text((made / "model" / "tokenizer.json").read_text() + " ")
    with pytest.raises(UserInputError, match="tokenizer.json is not the vocab the data .* was made with"):
        read_data_info(str(tmp_path / "data"))


def test_next_sentence_data_with_a_tokenizer_json_is_refused_by_create_data(made, tmp_path):
    """Neither family could train it (issue 37, item 13): BERT takes a vocab.txt, ModernBERT trains MLM only."""
    with pytest.raises(UserInputError, match="is a tokenizer.json, which only --model_family modernbert trains, and "
                                             "ModernBERT trains masked-LM data only") as refused:
        create_pretraining_data(Config.load(input=[str(made / "corpus.txt")], vocab_file=str(made / "model"),
                                            output_dir=str(tmp_path / "data"), workers=1, recipe="classic"))
    assert "Add --recipe modern (packed, MLM only) or --no_nsp" in str(refused.value)
    assert not (tmp_path / "data").exists()


def test_a_model_folder_is_a_vocab_file_and_a_lost_tokenizer_json_is_named(made, tmp_path):
    """train --vocab_file MODEL_FOLDER, as create-data takes it (item 14); a data folder whose tokenizer.json was
    deleted says so (item 21)."""
    from tpu_pretrain.core.resolve import RunPlan

    settings = dict(data_dir=str(made / "data"), model_family="modernbert", model_size="tiny",
                    output_dir=str(tmp_path / "run"))
    plan = RunPlan.resolve(Config.load(vocab_file=str(made / "model"), **settings))
    assert plan.model_config.vocab_size == 2048
    shutil.copytree(made / "data", tmp_path / "data")
    (tmp_path / "data" / "tokenizer.json").unlink()
    with pytest.raises(UserInputError, match=rf"The data folder {tmp_path / 'data'} lost its tokenizer.json: its "
                                             r"manifest records that the data was made with it \(sha256 "):
        RunPlan.resolve(Config.load(**{**settings, "data_dir": str(tmp_path / "data")}))
    plan = RunPlan.resolve(Config.load(**{**settings, "data_dir": str(tmp_path / "data"),
                                          "vocab_file": str(made / "model")}))  # the advice given works
    assert plan.vocab.setting == str(made / "model") and plan.vocab.source == made / "model" / "tokenizer.json"


def test_an_upper_case_json_suffix_is_a_tokenizer_json_not_a_wordpiece_vocab(made, tmp_path):
    from tpu_pretrain.data.vocab import Vocab

    shutil.copyfile(made / "model" / "tokenizer.json", tmp_path / "tokenizer.JSON")
    vocab = Vocab.read(str(tmp_path / "tokenizer.JSON"))
    assert vocab.is_tokenizer_json and vocab.copy_name == "tokenizer.json"
    assert vocab.tokens == Vocab.read(str(made / "model" / "tokenizer.json")).tokens


def test_a_modernbert_run_continued_as_bert_is_refused_for_its_family(made, tmp_path):
    """Issue 37, item 16: the refusal names the change of family, not the tokenizer.json BERT cannot take."""
    from numpy_trainer import NumpyTrainer

    from tpu_pretrain.core.loop import run_training
    from tpu_pretrain.core.resolve import RunPlan

    settings = dict(data_dir=str(made / "data"), output_dir=str(tmp_path / "run"), model_size="tiny",
                    train_batch_size=8, num_train_steps=2, save_checkpoints_steps=2, session_hours=-1)
    run_training(NumpyTrainer(Config.load(model_family="modernbert", **settings)), settings["output_dir"],
                 progress=False)
    with pytest.raises(UserInputError) as refused:
        RunPlan.resolve(Config.load(model_family="bert", **settings))
    said = str(refused.value)
    assert f"The run in {tmp_path / 'run'} is a modernbert run (model_family modernbert, run.json): a run cannot " \
           "change family" in said and "--model_family modernbert" in said and "tokenizer.json" not in said


def test_whole_word_masking_that_reaches_far_below_its_rate_says_so(made, tmp_path):
    """Issue 37, item 17: words of 150-250 characters are more BPE pieces than a sequence's masking budget, so
    whole-word masking reaches a few percent of the 30% asked for; the summary says the rate and why."""
    import random

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(150, 250)))
             for _ in range(400)]
    corpus = tmp_path / "long_words.txt"
    corpus.write_text("\n\n".join(" ".join(words[i:i + 4]) for i in range(0, 400, 4)) + "\n")
    settings = dict(input=[str(corpus)], vocab_file=str(made / "model"), recipe="modern", max_seq_length=SEQ,
                    dupe_factor=1, num_shards=1, eval_fraction=0, workers=1)
    summary = create_pretraining_data(Config.load(**settings, do_whole_word_mask=True,
                                                  output_dir=str(tmp_path / "wwm"))).summary()
    said = " ".join(summary.split())
    assert "warning: train: " in said and "of tokens are masked, far below masked_lm_prob=0.3 with whole-word " \
                                         "masking" in said and "Leave out --do_whole_word_mask" in said, said
    summary = create_pretraining_data(Config.load(**settings, output_dir=str(tmp_path / "plain"))).summary()
    assert "far below" not in summary  # without whole words, the rate is reached
