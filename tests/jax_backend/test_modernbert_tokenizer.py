"""Continued pretraining of a ModernBERT with its own byte-level BPE ``tokenizer.json``, end to end through the CLI:
a folder as a released model's looks (transformers' ``save_pretrained`` + the tokenizer.json, [PAD] not id 0, the
vocab padded to a multiple of 64), ``create-data --vocab_file FOLDER/tokenizer.json``, ``train --init_checkpoint
FOLDER``, ``export --format hf``; transformers' AutoTokenizer gives the data's ids and AutoModelForMaskedLM the run's
logits."""

import json

import numpy as np
from bpe_tokenizer import train_bpe_tokenizer
from corpora import WIKITEXT, needs_corpora
from test_modernbert_training import T, jax_cache, save_transformers_modernbert, torch, train_command, transformers

from tpu_pretrain.cli import main
from tpu_pretrain.data.tokenization import load_tokenizer

pytestmark = needs_corpora
__all__ = ["jax_cache"]  # the shared compilation cache, a fixture


def test_a_released_style_modernbert_continued_with_its_tokenizer_json(jax_cache, tmp_path):
    released = tmp_path / "released"
    train_bpe_tokenizer(released / "tokenizer.json", WIKITEXT)
    save_transformers_modernbert(released, released / "tokenizer.json", vocab_size=2048)  # 2005 tokens, padded
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(WIKITEXT.read_text(encoding="utf-8").splitlines()[:600]), encoding="utf-8")
    assert main(["create-data", "--input", str(corpus), "--vocab_file", str(released / "tokenizer.json"),
                 "--output_dir", str(tmp_path / "data"), "--recipe", "modern", "--max_seq_length", str(T),
                 "--dupe_factor", "1", "--num_shards", "1", "--eval_fraction", "0.05", "--workers", "1"]) == 0
    run = tmp_path / "run"
    command = train_command(tmp_path / "data", run, "--init_checkpoint", str(released), "--num_train_steps", "2")
    assert main(command[3:]) == 0
    recorded = json.loads((run / "modernbert_config.json").read_text())
    assert (recorded["vocab_size"], recorded["pad_token_id"], recorded["mask_token_id"]) == (2048, 2003, 2004)
    assert (run / "tokenizer.json").read_bytes() == (released / "tokenizer.json").read_bytes()

    folder = tmp_path / "hf"
    assert main(["export", str(run), "--format", "hf", "--output", str(folder)]) == 0
    model, info = transformers.AutoModelForMaskedLM.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ours = load_tokenizer(str(run / "tokenizer.json"))
    lines = [line.strip() for line in corpus.read_text(encoding="utf-8").splitlines() if len(line.split()) > 12]
    sentences = [lines[0], " ".join(lines[1].split()[:8]) + " |||IP_ADDRESS||| of the", lines[2]]
    encoded = tokenizer(sentences, padding="max_length", max_length=T, truncation=True, return_tensors="np")
    for text in sentences[::2]:  # the data's ids, with [CLS] ... [SEP] around them
        assert tokenizer(text)["input_ids"] == [ours.cls_id, *ours.encode(text), ours.sep_id]
    assert (tokenizer.pad_token_id, tokenizer.mask_token_id) == (2003, 2004)

    ids, attend = encoded["input_ids"].astype(np.int32), encoded["attention_mask"]
    assert 0 in ids[1][attend[1] > 0]  # id 0 inside a row is a token ([PAD] is 2003), not padding
    positions = np.zeros((len(sentences), 20), np.int32)
    for row in range(len(sentences)):
        real = np.flatnonzero(attend[row] & (ids[row] < 2000) & (ids[row] > 0))[::4][:20]
        positions[row, :len(real)] = real
        ids[row, real] = tokenizer.mask_token_id
    with torch.no_grad():
        logits = model.eval()(input_ids=torch.tensor(ids, dtype=torch.long),
                              attention_mask=torch.tensor(attend, dtype=torch.long)).logits.numpy()
    theirs = np.take_along_axis(logits, positions[:, :, None], axis=1)
    from tpu_pretrain.export.rebuild import load_trained_model

    trained = load_trained_model(run)
    zero_padded = np.where(attend > 0, ids, 0)  # as the shards, fill-mask and probe pad: with id 0
    for inputs in (zero_padded, ids):
        outputs = trained.model.outputs(inputs, np.zeros_like(ids), positions)[0]
        worst = float(np.abs(outputs - theirs).max())
        print(f"MLM logits, JAX run vs transformers on the export: max abs difference {worst:.3g}")
        np.testing.assert_allclose(outputs, theirs, atol=1e-4, rtol=0)
