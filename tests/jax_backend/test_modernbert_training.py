"""ModernBERT through the normal commands on the JAX backend: ``create-data --recipe modern`` data from the built-in
sample corpus, ``train --model_family modernbert`` as a CLI process, ``export --format hf`` loaded by transformers'
``AutoModelForMaskedLM`` (no missing or unexpected weights) to the same MLM logits on real sentences, ``evaluate``;
a SIGKILLed run resumed to the same weights, optimizer moments and dropout state as an uninterrupted one; continued
pretraining from a folder saved by transformers' ``save_pretrained``; and the refusals, each with its message.

Tiny shapes (``--model_size tiny``: 2 layers, hidden 128; 64-token packed rows), 12 steps. The training processes
share JAX's persistent compilation cache, so only the first one compiles.
"""

import importlib.util
import json
import logging
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")
if importlib.util.find_spec("tensorflow") is not None:  # the JAX backend's own tests run once, where JAX runs
    pytest.skip("for the environment without TensorFlow (make test-jax-stack)", allow_module_level=True)
if "keras" in sys.modules and sys.modules["keras"].backend.backend() != "jax":
    pytest.skip("Keras already runs on another backend in this process (run this file alone, or in .venv-jax)",
                allow_module_level=True)
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from fault_injection import ENV  # noqa: E402

from tpu_pretrain.cli import main  # noqa: E402
from tpu_pretrain.config import Config  # noqa: E402
from tpu_pretrain.data.create import create_pretraining_data  # noqa: E402
from tpu_pretrain.data.sample_corpus import write_sample_corpus  # noqa: E402
from tpu_pretrain.data.vocab import build_vocab, load_vocab  # noqa: E402
from tpu_pretrain.errors import UserInputError  # noqa: E402
from tpu_pretrain.models.run_weights import read_arrays  # noqa: E402

STEPS, T = 12, 64


@pytest.fixture(scope="module")
def jax_cache(tmp_path_factory):
    """JAX's persistent compilation cache for this process and the training processes it starts: they train the
    same program, compiled once."""
    import jax

    folder = str(tmp_path_factory.mktemp("jax_cache"))
    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")
    before = {name: getattr(jax.config, name) for name in names}
    for name, value in zip(names, (folder, 0, 0), strict=True):
        jax.config.update(name, value)
    yield {**ENV, "JAX_COMPILATION_CACHE_DIR": folder, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    for name, value in before.items():
        jax.config.update(name, value)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """``vocab`` and ``create-data --recipe modern`` (packed, MLM only, 30% masking) on the sample corpus."""
    root = tmp_path_factory.mktemp("modernbert_data")
    corpus = write_sample_corpus(root / "corpus.txt", max_chars=60_000)
    vocab = build_vocab(Config.load(input=[str(corpus)], vocab_size=1200, num_unused_tokens=5, output_dir=str(root)))
    create_pretraining_data(Config.load(input=[str(corpus)], vocab_file=vocab.path, output_dir=str(root / "data"),
                                        recipe="modern", max_seq_length=T, dupe_factor=1, num_shards=2,
                                        eval_fraction=0.05, workers=1))
    return root


def train_command(data_dir, run, *extra) -> list[str]:
    return [sys.executable, "-m", "tpu_pretrain", "train", "--backend", "jax", "--model_family", "modernbert",
            "--model_size", "tiny", "--data_dir", str(data_dir), "--output_dir", str(run), "--train_batch_size", "8",
            "--num_train_steps", str(STEPS), "--num_warmup_steps", "2", "--learning_rate", "2e-3",
            "--save_checkpoints_steps", "2", "--eval_every_steps", "0", "--max_eval_steps", "1",
            "--steps_per_execution", "2", "--hidden_dropout_prob", "0.1", "--train_seed", "3", "--session_hours", "-1",
            *extra]


@pytest.fixture(scope="module")
def reference(data, jax_cache, tmp_path_factory):
    """An uninterrupted ModernBERT run, trained by a ``tpu-pretrain train`` process."""
    run = tmp_path_factory.mktemp("modernbert_runs") / "reference"
    tick = time.perf_counter()
    done = subprocess.run(train_command(data / "data", run), capture_output=True, text=True, env=jax_cache, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"reference run: {time.perf_counter() - tick:.1f} s")
    return run


def final_state(run) -> dict[str, np.ndarray]:
    return read_arrays(Path(run) / "checkpoints" / f"ckpt-{STEPS:09d}")


def masked_sentences(corpus: Path, tokenizer, rows: int = 3, mask_every: int = 4):
    """Real sentences of the corpus tokenized as the run's data is (64 tokens, padded; a short one among them), a
    [MASK] on every ``mask_every``-th word piece; the masked positions, padded with 0 to 20 per row."""
    lines = [line.strip() for line in corpus.read_text(encoding="utf-8").splitlines() if len(line.split()) > 12]
    sentences = [lines[0], " ".join(lines[1].split()[:8]), lines[2]][:rows]
    encoded = tokenizer(sentences, padding="max_length", max_length=T, truncation=True, return_tensors="np")
    ids = encoded["input_ids"].astype(np.int32)
    positions = np.zeros((len(sentences), 20), np.int32)
    for row in range(len(sentences)):
        real = np.flatnonzero(ids[row] > tokenizer.sep_token_id)[::mask_every][:20]
        positions[row, :len(real)] = real
        ids[row, real] = tokenizer.mask_token_id
    return ids, positions


def test_trained_by_the_cli_exported_and_loaded_by_transformers_to_the_same_logits(data, reference, tmp_path, capsys):
    from tpu_pretrain.export.rebuild import load_trained_model

    state = final_state(reference)
    assert "params/model.embeddings.tok_embeddings.weight" in state and "m/head.dense.weight" in state
    assert not any("bert/" in name for name in state)  # transformers' names, not Google's
    recorded = json.loads((reference / "modernbert_config.json").read_text())
    assert recorded["model_type"] == "modernbert" and recorded["embedding_dropout"] == 0.1
    config = json.loads((reference / "config.json").read_text())
    assert config["model"]["model_family"] == "modernbert" and config["data"]["recipe"] == "modern"
    assert (config["train"]["lr_schedule"], config["train"]["adam_beta2"]) == ("wsd", 0.98)  # the modern recipe's

    folder = tmp_path / "hf"
    assert main(["export", str(reference), "--format", "hf", "--output", str(folder)]) == 0
    model, info = transformers.AutoModelForMaskedLM.from_pretrained(folder, output_loading_info=True)
    assert type(model).__name__ == "ModernBertForMaskedLM"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    tokens = load_vocab(reference / "vocab.txt")
    for name in ("pad", "cls", "sep", "mask"):
        token_id = getattr(tokenizer, f"{name}_token_id")
        assert token_id == getattr(model.config, f"{name}_token_id", token_id) == tokens.index(f"[{name.upper()}]")

    ids, positions = masked_sentences(data / "corpus.txt", tokenizer)
    assert (ids == 0).any() and len(set((ids != 0).sum(axis=1))) > 1  # padded rows of different lengths
    with torch.no_grad():
        logits = model.eval()(input_ids=torch.tensor(ids, dtype=torch.long),
                              attention_mask=torch.tensor(ids != 0, dtype=torch.long)).logits.numpy()
    theirs = np.take_along_axis(logits, positions[:, :, None], axis=1)
    trained = load_trained_model(reference)
    ours = trained.model.outputs(ids, np.zeros_like(ids), positions)[0]
    worst = float(np.abs(ours - theirs).max())
    print(f"MLM logits, JAX checkpoint vs transformers on the export: max abs difference {worst:.3g}")
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)

    capsys.readouterr()
    assert main(["evaluate", str(reference), "--output", str(tmp_path / "evaluation.json"), "--sentence",
                 "The [MASK] of the city was built in the [MASK] century."]) == 0
    said = capsys.readouterr().out
    assert "The [MASK] of the city" in said and "mask 1: " in said and "mask 2: " in said, said
    filled = json.loads((tmp_path / "evaluation.json").read_text())["fill_mask"]
    assert [len(slot["candidates"]) for slot in filled[0]["masks"]] == [5, 5], filled
    figures = json.loads((tmp_path / "evaluation.json").read_text())["metrics"]
    final = json.loads((reference / "train_summary.json").read_text())["final_eval"]
    assert "nsp_accuracy" not in figures and figures["mlm_loss"] == pytest.approx(final["mlm_loss"], rel=1e-5)


def test_a_sigkilled_modernbert_run_resumes_to_the_same_state(data, reference, jax_cache, tmp_path, caplog):
    """Killed once its step-2 checkpoint exists, started again: the final weights, Adam moments and dropout's RNG
    state equal the uninterrupted run's (dropout on: its masks are a function of seed and step)."""
    run = tmp_path / "interrupted"
    command = train_command(data / "data", run)
    process = subprocess.Popen(command, env=jax_cache, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = run / "checkpoints" / "ckpt-000000002"
    deadline = time.time() + 300
    while process.poll() is None and not first.is_dir() and time.time() < deadline:
        time.sleep(0.002)
    killed = process.poll() is None
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert killed and first.is_dir(), "the process ended before a checkpoint after step 2 existed"
    steps_before = sorted(p.name for p in (run / "checkpoints").glob("ckpt-*"))
    assert f"ckpt-{STEPS:09d}" not in steps_before, steps_before
    with caplog.at_level(logging.INFO):  # resumed in this process (it has JAX loaded, and the compilation cache)
        assert main(command[3:]) == 0
    assert "Resuming from" in caplog.text
    expected, got = final_state(reference), final_state(run)
    assert expected.keys() == got.keys() and any(name.startswith("keras/") for name in expected)
    worst = max(float(np.abs(got[n].astype(np.float64) - expected[n]).max()) for n in expected)
    print(f"killed after {steps_before[-1]}; max abs difference of the final state: {worst:.3g}")
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], atol=1e-6, rtol=0, err_msg=name)


def test_modernbert_trains_in_float16_within_its_precision_of_float32(data, reference, tmp_path):
    """``--mixed_precision float16`` (what ``auto`` takes on a GPU with float16 tensor cores and no bfloat16: the free
    T4): the reference run computed in float16 with its loss scaled, no step overflowing, its losses and weights
    within float16's precision of the float32 run's (12 AdamW steps of 2e-3 move a weight up to ~2e-2)."""
    from tpu_pretrain.export.plots import read_scalars

    run = tmp_path / "float16"
    done = subprocess.run(train_command(data / "data", run, "--mixed_precision", "float16"), capture_output=True,
                          text=True, env=ENV, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "float16" in done.stdout + done.stderr
    halves, exact = final_state(run), final_state(reference)
    assert float(halves.pop("loss_scale/scale")) == 2.0**15 and int(halves.pop("loss_scale/good_steps")) == STEPS
    assert halves.keys() == exact.keys()
    worst = max(float(np.abs(halves[n].astype(np.float64) - exact[n]).max()) for n in exact)
    losses = [[v for _, v in read_scalars(r)["train"]["loss"]] for r in (run, reference)]
    print(f"float16 losses {np.round(losses[0], 5)}, float32 {np.round(losses[1], 5)}; weights apart up to {worst:.3g}")
    np.testing.assert_allclose(*losses, rtol=1e-3)
    assert 0 < worst < 2e-3


def save_transformers_modernbert(folder: Path, vocab_file: Path, vocab_size: int | None = None):
    """A ModernBERT of another shape than any named size (a 16-token window on the 64-token rows), saved by
    transformers' ``save_pretrained`` with the vocab's size and special ids (no mask id: released configs leave it
    to the tokenizer); its state dict, and the model."""
    tokens = load_vocab(vocab_file)
    config = transformers.ModernBertConfig(
        vocab_size=vocab_size or len(tokens), hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=2, global_attn_every_n_layers=2, local_attention=16, max_position_embeddings=128,
        pad_token_id=tokens.index("[PAD]"), cls_token_id=tokens.index("[CLS]"), sep_token_id=tokens.index("[SEP]"),
        bos_token_id=tokens.index("[CLS]"), eos_token_id=tokens.index("[SEP]"))
    torch.manual_seed(0)
    model = transformers.ModernBertForMaskedLM(config)
    with torch.no_grad():  # norms and the decoder bias away from their initial ones and zeros: a lost one shows
        for value in model.parameters():
            if value.ndim == 1:
                value.add_(0.1 * torch.randn_like(value))
    model.save_pretrained(folder)
    return {name: value.detach().numpy() for name, value in model.state_dict().items()}, model.eval()


def test_continued_pretraining_from_a_transformers_folder(data, jax_cache, tmp_path):
    from tpu_pretrain.core.resolve import RunPlan
    from tpu_pretrain.jax_backend.input import BATCH_FEATURES, eval_batches
    from tpu_pretrain.jax_backend.trainer import JaxTrainer

    folder = tmp_path / "released"
    saved, model = save_transformers_modernbert(folder, data / "vocab.txt")
    settings = dict(backend="jax", model_family="modernbert", init_checkpoint=str(folder),
                    data_dir=str(data / "data"), output_dir=str(tmp_path / "run"), train_batch_size=8,
                    num_train_steps=2)
    trainer = JaxTrainer(Config.load(**settings))
    mask = load_vocab(data / "vocab.txt").index("[MASK]")
    assert trainer.model_config.hidden_size == 64 and trainer.model_config.mask_token_id == mask  # from the vocab
    weights = trainer.stored_weights()
    assert set(weights) == set(saved) - {"decoder.weight"}  # tied to the embeddings, as transformers saves it
    for name, value in weights.items():
        np.testing.assert_array_equal(value, saved[name], err_msg=name)

    batch = next(eval_batches(trainer.data.train_files, 8, T, trainer.config.data.max_predictions_per_seq))
    stats = trainer._eval_step(trainer.state, {k: batch[k] for k in BATCH_FEATURES})
    ours = float(stats["mlm_loss_sum"] / stats["mlm_weight"])
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                       attention_mask=torch.tensor(batch["input_ids"] != 0, dtype=torch.long)).logits
    picked = torch.gather(logits, 1, torch.tensor(batch["masked_lm_positions"], dtype=torch.long)[:, :, None].expand(
        -1, -1, logits.shape[-1]))
    losses = torch.nn.functional.cross_entropy(picked.reshape(-1, picked.shape[-1]),
                                               torch.tensor(batch["masked_lm_ids"], dtype=torch.long).reshape(-1),
                                               reduction="none").numpy()
    weight = batch["masked_lm_weights"].reshape(-1)
    theirs = float((losses * weight).sum() / weight.sum())
    print(f"first batch's MLM loss: JAX {ours:.6f}, transformers {theirs:.6f}")
    assert ours == pytest.approx(theirs, abs=1e-4)

    other = tmp_path / "other_vocab"
    save_transformers_modernbert(other, data / "vocab.txt", vocab_size=len(load_vocab(data / "vocab.txt")) + 8)
    with pytest.raises(UserInputError, match=r"vocab_size is 1208 \(init_checkpoint .*\) but the data's vocab has "
                                             r"1200 tokens"):
        RunPlan.resolve(Config.load(**{**settings, "init_checkpoint": str(other)}))


def test_the_family_is_taken_from_a_transformers_folder(data, tmp_path, capsys):
    """--init_checkpoint of a ModernBERT folder alone trains a ModernBERT (its config.json says so); only a
    --model_family that contradicts it is refused."""
    from tpu_pretrain.cli import build_parser, config_from_args
    from tpu_pretrain.config import step_settings
    from tpu_pretrain.core.resolve import RunPlan

    folder = tmp_path / "released"
    save_transformers_modernbert(folder, data / "vocab.txt")
    argv = ["train", "--init_checkpoint", str(folder), "--data_dir", str(data / "data"), "--output_dir",
            str(tmp_path / "run"), "--train_batch_size", "8"]
    plan = RunPlan.resolve(config_from_args(build_parser().parse_args(argv), step_settings("train")))
    assert plan.family.name == "modernbert" and plan.config.data.recipe == "modern"
    assert plan.model_config.hidden_size == 64
    assert main([*argv, "--model_family", "bert"]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert f"model_family=bert contradicts init_checkpoint {folder}, whose config.json describes a modernbert" in said
    assert not (tmp_path / "run").exists()


def test_what_a_modernbert_run_refuses(data, reference, tmp_path, capsys):
    from tpu_pretrain.training import train

    missing = tmp_path / "no_data_here"  # read first, it would fail on the missing data folder instead
    assert main(["train", "--backend", "tensorflow", "--model_family", "modernbert", "--model_size", "tiny",
                 "--data_dir", str(missing), "--output_dir", str(tmp_path / "tf_run")]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert ("model_family='modernbert' (ModernBERT) is offered by the jax backend, not tensorflow: train with "
            "--backend jax, or leave model_family unset") in said
    assert not missing.exists()

    resumed = tmp_path / "resumed"
    shutil.copytree(reference, resumed)
    with pytest.raises(UserInputError, match=r"is a modernbert run .*a run cannot change family") as caught:
        train(backend="jax", model_family="bert", model_size="tiny", data_dir=str(data / "data"),
              output_dir=str(resumed), train_batch_size=8, num_train_steps=STEPS + 2, train_seed=3)
    assert "model vocab_size" not in str(caught.value)  # another family: its shape is not listed field by field
    (resumed / "modernbert_config.json").unlink()
    assert main(["export", str(resumed)]) == 2
    assert "holds a training run (checkpoints/, run.json) but not its modernbert_config.json" in " ".join(
        capsys.readouterr().err.split())

    nsp = tmp_path / "nsp"
    create_pretraining_data(Config.load(input=[str(data / "corpus.txt")], vocab_file=str(data / "vocab.txt"),
                                        output_dir=str(nsp), max_seq_length=T, max_predictions_per_seq=10,
                                        dupe_factor=1, max_documents=80, workers=1, recipe="classic"))
    with pytest.raises(UserInputError, match=r"model_family=modernbert trains the masked LM alone, but the data in "
                                             r".* was made with next-sentence pairs .*--recipe modern"):
        train(backend="jax", model_family="modernbert", model_size="tiny", data_dir=str(nsp),
              output_dir=str(tmp_path / "nsp_run"), train_batch_size=8)

    assert main(["export", str(reference), "--format", "tf", "--output", str(tmp_path / "tf")]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "format=tf: Google's BERT checkpoint (bert_model.ckpt) has no place for a ModernBERT" in said
    assert "--format hf" in said and not (tmp_path / "tf").exists()


LONG = 1024


def test_modernbert_at_1024_from_the_command_line(data, jax_cache, tmp_path, capsys):
    """``create-data --max_seq_length 1024`` with no config file (the data has no position limit); ``train`` a tiny
    ModernBERT on it (the named size's released 8,192 positions); ``evaluate``; ``export`` loaded by transformers'
    ``ModernBertForMaskedLM`` to the same logits on a row longer than 512 tokens (sliding-window layers included).
    A model with fewer positions than the data's length is refused by train, naming --max_position_embeddings."""
    from tpu_pretrain.export.rebuild import load_trained_model

    long_data = tmp_path / "data"
    assert main(["create-data", "--recipe", "modern", "--input", str(data / "corpus.txt"), "--vocab_file",
                 str(data / "vocab.txt"), "--output_dir", str(long_data), "--max_seq_length", str(LONG),
                 "--dupe_factor", "2", "--eval_fraction", "0.1", "--workers", "1"]) == 0
    manifest = json.loads((long_data / "manifest.json").read_text())
    assert manifest["settings"]["max_seq_length"] == LONG

    capsys.readouterr()
    refused = ["train", "--backend", "jax", "--model_family", "modernbert", "--model_size", "tiny", "--data_dir",
               str(long_data), "--output_dir", str(tmp_path / "short"), "--train_batch_size", "2",
               "--max_position_embeddings", "512"]
    assert main(refused) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert (f"has max_seq_length {LONG}, above the model's max_position_embeddings 512: train with "
            f"--max_position_embeddings {LONG} (or more)") in said, said
    refused[refused.index("modernbert")] = "bert"
    assert main(refused[:-2]) == 2  # BERT's own 512
    assert "above the model's max_position_embeddings 512" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "short").exists()

    run = tmp_path / "run"
    command = train_command(long_data, run)[3:]
    for flag, value in (("--train_batch_size", "2"), ("--num_train_steps", "4")):
        command[command.index(flag) + 1] = value
    assert main(command) == 0
    recorded = json.loads((run / "modernbert_config.json").read_text())
    assert recorded["max_position_embeddings"] == 8192  # ModernBERT's released positions
    assert json.loads((run / "config.json").read_text())["model"]["max_position_embeddings"] == 8192

    assert main(["evaluate", str(run), "--output", str(tmp_path / "evaluation.json")]) == 0
    figures = json.loads((tmp_path / "evaluation.json").read_text())["metrics"]
    assert np.isfinite(figures["mlm_loss"]) and figures["mlm_loss"] > 0

    folder = tmp_path / "hf"
    assert main(["export", str(run), "--format", "hf", "--output", str(folder)]) == 0
    model, info = transformers.ModernBertForMaskedLM.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    text = " ".join((data / "corpus.txt").read_text(encoding="utf-8").split())
    encoded = tokenizer([text, " ".join(text.split()[:300])], padding="max_length", max_length=LONG,
                        truncation=True, return_tensors="np")
    ids = encoded["input_ids"].astype(np.int32)
    assert (ids[0] != 0).all() and (ids[1] == 0).any()  # a full row of 1,024 and a padded one
    positions = np.zeros((2, 24), np.int32)
    for row in range(2):
        real = np.flatnonzero(ids[row] > tokenizer.sep_token_id)[::42][:24]  # spread over the row, past 512
        positions[row, :len(real)] = real
        ids[row, real] = tokenizer.mask_token_id
    assert positions.max() > 900
    with torch.no_grad():
        logits = model.eval()(input_ids=torch.tensor(ids, dtype=torch.long),
                              attention_mask=torch.tensor(ids != 0, dtype=torch.long)).logits.numpy()
    theirs = np.take_along_axis(logits, positions[:, :, None], axis=1)
    ours = load_trained_model(run).model.outputs(ids, np.zeros_like(ids), positions)[0]
    worst = float(np.abs(ours - theirs).max())
    print(f"MLM logits at {LONG}, JAX checkpoint vs transformers on the export: max abs difference {worst:.3g}")
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)


def test_a_run_continued_keeps_its_positions(data, reference, tmp_path):
    """A ModernBERT run started when its named size had 512 positions continues with them (the default is the run's,
    not the released 8,192, which would change its shape and refuse the resume); a new run gets 8,192."""
    from tpu_pretrain.core.resolve import RunPlan

    older = tmp_path / "older"
    shutil.copytree(reference, older)
    for name, section in (("modernbert_config.json", None), ("run.json", "model")):
        record = json.loads((older / name).read_text())
        (record[section] if section else record)["max_position_embeddings"] = 512
        (older / name).write_text(json.dumps(record))
    settings = dict(backend="jax", model_family="modernbert", model_size="tiny", data_dir=str(data / "data"),
                    train_batch_size=8)
    assert RunPlan.resolve(Config.load(**settings, output_dir=str(older))).model_config.max_position_embeddings == 512
    fresh = RunPlan.resolve(Config.load(**settings, output_dir=str(tmp_path / "new")))
    assert fresh.model_config.max_position_embeddings == 8192


RELEASED = 8192


def test_modernbert_smoke_at_8192_from_the_command_line(data, jax_cache, tmp_path):
    """ModernBERT at its released length, a smoke through every step of the command line: ``create-data
    --max_seq_length 8192``, ``train`` (2 steps), ``train`` again to continue (a third step), ``evaluate``, ``export``
    loaded by transformers to the same logits at positions past 4,096. The commands run as processes with XLA's
    optimised code: at this length its unoptimised code (the tests' level 0) runs the steps over twice as long."""
    from tpu_pretrain.export.rebuild import load_trained_model

    long_data, run, folder = tmp_path / "data", tmp_path / "run", tmp_path / "hf"
    optimised = {**jax_cache, "XLA_FLAGS": ""}

    def cli(*args):
        done = subprocess.run([sys.executable, "-m", "tpu_pretrain", *args], env=optimised, capture_output=True,
                              text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]

    cli("create-data", "--recipe", "modern", "--input", str(data / "corpus.txt"), "--vocab_file",
        str(data / "vocab.txt"), "--output_dir", str(long_data), "--max_seq_length", str(RELEASED),
        "--dupe_factor", "3", "--eval_fraction", "0.2", "--workers", "1")
    command = train_command(long_data, run)[3:]
    for flag, value in (("--train_batch_size", "1"), ("--num_train_steps", "2"), ("--steps_per_execution", "1")):
        command[command.index(flag) + 1] = value
    cli(*command)
    command[command.index("--num_train_steps") + 1] = "3"
    cli(*command, "--rewarm_steps", "1")  # its rate had decayed to 0: a new phase, one step
    assert (run / "checkpoints" / "ckpt-000000003").is_dir()
    cli("evaluate", str(run), "--output", str(tmp_path / "evaluation.json"))
    assert np.isfinite(json.loads((tmp_path / "evaluation.json").read_text())["metrics"]["mlm_loss"])

    cli("export", str(run), "--format", "hf", "--output", str(folder))
    model = transformers.ModernBertForMaskedLM.from_pretrained(folder, attn_implementation="eager")
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    text = " ".join((data / "corpus.txt").read_text(encoding="utf-8").split())
    ids = tokenizer([text], max_length=RELEASED, truncation=True, return_tensors="np")["input_ids"].astype(np.int32)
    assert ids.shape == (1, RELEASED)
    positions = np.flatnonzero(ids[0] > tokenizer.sep_token_id)[::97][-16:][None].astype(np.int32)
    assert positions.min() > 4096
    ids[0, positions[0]] = tokenizer.mask_token_id
    with torch.no_grad():
        logits = model.eval()(input_ids=torch.tensor(ids, dtype=torch.long)).logits.numpy()
    theirs = np.take_along_axis(logits, positions[:, :, None], axis=1)
    ours = load_trained_model(run).model.outputs(ids, np.zeros_like(ids), positions)[0]
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)


def test_a_run_on_the_splash_kernel_trains_evaluates_and_equals_xlas(data, tmp_path, monkeypatch):
    """``TPU_PRETRAIN_ATTENTION=splash`` (the TPU's kernel, here in Pallas's interpreter) through the command line at
    128 tokens: training calls and the evaluation trace the kernel in turn (a kernel built in one trace once broke
    the next, on the TPU too), documents apart, sliding-window layers, projections in the kernel's order; the weights
    after four steps equal those of the same run on XLA's attention."""
    rows = tmp_path / "data"
    create_pretraining_data(Config.load(input=[str(data / "corpus.txt")], vocab_file=str(data / "vocab.txt"),
                                        output_dir=str(rows), recipe="modern", max_seq_length=128, dupe_factor=1,
                                        num_shards=1, eval_fraction=0.1, workers=1))
    states = {}
    for path in ("splash", "xla"):
        monkeypatch.setenv("TPU_PRETRAIN_ATTENTION", path)
        command = train_command(rows, tmp_path / path)[3:]
        for flag, value in (("--train_batch_size", "4"), ("--num_train_steps", "4"), ("--save_checkpoints_steps", "4"),
                            ("--hidden_dropout_prob", "0")):
            command[command.index(flag) + 1] = value
        assert main(command) == 0
        summary = json.loads((tmp_path / path / "train_summary.json").read_text())
        assert np.isfinite(summary["final_eval"]["mlm_loss"])
        states[path] = read_arrays(tmp_path / path / "checkpoints" / f"ckpt-{4:09d}")
    assert states["splash"].keys() == states["xla"].keys()
    for name, value in states["splash"].items():
        if name.startswith("params/"):
            np.testing.assert_allclose(value, states["xla"][name], atol=2e-5, rtol=0, err_msg=name)
