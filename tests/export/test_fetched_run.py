"""A run brought back from its mirror onto a fresh runtime, where its data folder does not exist, can
be evaluated and exported: the run folder carries its own vocab and the mirror carries the run folder."""

import shutil

import tpu_pretrain  # noqa: F401  (Keras 2 before TensorFlow)
from tpu_pretrain.config import Config
from tpu_pretrain.core.mirror import fetch_run
from tpu_pretrain.data.create import create_pretraining_data
from tpu_pretrain.data.sample_corpus import write_sample_corpus
from tpu_pretrain.data.vocab import build_vocab
from tpu_pretrain.export.evaluate import evaluate
from tpu_pretrain.export.writers import export
from tpu_pretrain.training import train


def test_a_fetched_run_without_its_data_folder_evaluates_and_exports(tmp_path):
    old_machine = tmp_path / "old_machine"
    corpus = write_sample_corpus(old_machine / "corpus.txt", max_chars=40_000)
    vocab = build_vocab(Config.load(input=[str(corpus)], vocab_size=1200, num_unused_tokens=5,
                                    output_dir=str(old_machine)))
    create_pretraining_data(Config.load(input=[str(corpus)], vocab_file=vocab.path, workers=1,
                                        output_dir=str(old_machine / "data"), max_seq_length=64,
                                        max_predictions_per_seq=10, dupe_factor=1))
    mirror = tmp_path / "drive" / "run"  # a Drive-like durable folder
    train(Config.load(data_dir=str(old_machine / "data"), output_dir=str(old_machine / "run"),
                      model_size="L2-H128", train_batch_size=8, num_train_steps=4, num_warmup_steps=1,
                      save_checkpoints_steps=2, eval_every_steps=0, max_eval_steps=1, mirror_dir=str(mirror)),
          progress=False)
    shutil.rmtree(old_machine)  # the session ended: nothing of that machine is left

    fresh = tmp_path / "fresh_runtime" / "run"
    assert fetch_run(str(mirror), fresh)
    result = evaluate(fresh, sentences=["The module provides [MASK] for files."], top_k=3)
    assert result.step == 4 and result.metrics is None  # no data here: figures skipped, said so
    assert "no data folder here" in result.summary()
    assert len(result.fill_mask[0]["masks"][0]["candidates"]) == 3
    hf = export(fresh, "hf")
    assert (hf / "model.safetensors").is_file() and (hf / "vocab.txt").read_text() == (fresh / "vocab.txt").read_text()
    assert (export(fresh, "tf") / "bert_model.ckpt.index").is_file()
