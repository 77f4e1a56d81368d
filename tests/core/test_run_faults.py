"""A real run (the JAX backend, two short sessions through the command line) and what careless users then do
to it (issue 24): continue it with ``--backend auto`` or other data settings, lower its step count, mirror it
into itself, give it a session shorter than the save margin, create data into it, swap its vocab, delete its
config.json, kill an export, pipe its status into ``head``. Every answer is a message, never a traceback."""

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fault_injection import ENV, sample_data

from tpu_pretrain.cli import main
from tpu_pretrain.config import Config
from tpu_pretrain.data.create import create_pretraining_data
from tpu_pretrain.data.sample_corpus import write_sample_corpus
from tpu_pretrain.data.vocab import build_vocab

pytest.importorskip("jax")
COMMON = ["--model_size", "L2-H128", "--train_batch_size", "8", "--num_warmup_steps", "1",
          "--save_checkpoints_steps", "100", "--log_every_steps", "100", "--steps_per_execution", "2", "--accelerator",
          "cpu"]  # no eval shards, one compiled call, one save: the least compiling and writing


def tpu_pretrain(*args, timeout=600):
    done = subprocess.run([sys.executable, "-m", "tpu_pretrain", *args], capture_output=True, text=True,
                          timeout=timeout, env=ENV)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Classic (NSP, 15%) data trained with --recipe modern (its wsd swapped for linear: JAX) for a session that
    ends at once, then continued with --backend auto and another masked_lm_prob: the run folder and both outputs."""
    root = tmp_path_factory.mktemp("run_faults")
    corpus = write_sample_corpus(root / "corpus.txt", max_chars=30_000)
    vocab = build_vocab(Config.load(input=[str(corpus)], vocab_size=1500, num_unused_tokens=5, output_dir=str(root)))
    data = str(root / "data")
    create_pretraining_data(Config.load(input=[str(corpus)], vocab_file=vocab.path, output_dir=data, max_seq_length=64,
                                        max_predictions_per_seq=10, dupe_factor=1, num_shards=1, eval_fraction=0,
                                        workers=1, recipe="classic"))
    folder = root / "run"
    first = tpu_pretrain("train", "--backend", "jax", "--recipe", "modern", "--lr_schedule", "linear", "--data_dir",
                         data, "--output_dir", str(folder), "--num_train_steps", "6", *COMMON, "--session_hours",
                         "0.00001", "--session_margin_minutes", "0")  # a session over at once: saved at step 2
    assert first.returncode == 75, first.stderr[-3000:]
    # ended there (nothing left to compile or run): the resume, the backend and the recorded settings are what count
    second = tpu_pretrain("train", "--output_dir", str(folder), "--backend", "auto", "--masked_lm_prob", "0.3",
                          "--num_train_steps", "2", "--session_hours", "-1")
    assert second.returncode == 0, second.stderr[-3000:]
    return folder, first.stderr, second.stderr


def test_auto_continues_a_run_on_its_own_backend(run):
    folder, _, second = run
    assert "Training backend: jax (the backend this run was started with)" in second
    assert "Resuming from" in second and "step 2 of 2" in second
    assert json.loads((folder / "config.json").read_text())["train"]["backend"] == "jax"


def test_a_resume_says_where_its_backend_and_shapes_come_from(run):
    folder, first, _ = run
    assert "max_seq_length=64 and max_predictions_per_seq=10, from the data in" in first
    assert "configuration had" not in first  # nobody set them: nothing to contradict
    again = tpu_pretrain("train", "--output_dir", str(folder), "--num_train_steps", "2", "--session_hours", "-1")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Training backend: jax (the backend this run was started with)" in again.stderr  # nobody asked for it
    assert "(requested)" not in again.stderr


def test_the_run_records_the_data_it_trained_on(run):
    folder, first, second = run
    recorded = Config.from_file(folder / "config.json")
    assert recorded.data.pack_sequences is False and recorded.data.masked_lm_prob == 0.15
    said = " ".join(first.split())
    assert "was made with" in said and "pack_sequences=False" in said and "masked_lm_prob=0.15" in said
    assert "where this run's modern recipe has" in said and "--recipe classic" in said  # said once, with the way out
    assert "was made with masked_lm_prob=0.15, not 0.3" in second  # a change on resume: said, not recorded


def test_refusals_on_a_run_leave_it_as_it_was(run, capsys):
    folder, _, _ = run
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    train = ["train", "--backend", "jax", "--output_dir", str(folder)]
    cases = [
        (train + ["--num_train_steps", "1"], "is at step 2 (ckpt-000000002), past num_train_steps=1: there is "
                                             "nothing to train"),
        (train + ["--mirror_dir", str(folder / "checkpoints" / "mirror")], "is inside output_dir"),
        (train + ["--session_hours", "0.1", "--session_margin_minutes", "10"],
         "a session of 6 min ends within the last session_margin_minutes=10"),
        (["create-data", "--input", str(folder / "config.json"), "--vocab_file", str(folder / "vocab.txt"),
          "--output_dir", str(folder)], "holds a training run: shards would land among its checkpoints"),
    ]
    for args, says in cases:
        assert main(args) == 2, args
        assert says in " ".join(capsys.readouterr().err.split()), args
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
    status = tpu_pretrain("status", str(folder))
    assert "step 2 of 2 (100.0%)" in status.stdout


def test_status_piped_into_head_says_nothing_more(run):
    process = subprocess.Popen([sys.executable, "-m", "tpu_pretrain", "status", str(run[0])],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()  # the reader is gone before anything is written, as `| head -1` can be
    err = process.stderr.read()
    process.wait(timeout=60)
    assert "BrokenPipeError" not in err and "Traceback" not in err and "Exception ignored" not in err, err


def test_export_checks_its_vocab_cleans_a_killed_export_and_names_a_lost_config(run, tmp_path, capsys):
    folder = run[0]
    out = tmp_path / "hf"
    killed = subprocess.run([sys.executable, "-c", "import os, signal\nfrom tpu_pretrain.storage.local import "
                             f"new_temp_folder\nnew_temp_folder({str(out)!r})\nos.kill(os.getpid(), signal.SIGKILL)"])
    assert killed.returncode == -signal.SIGKILL
    assert len(list(tmp_path.glob(".hf*"))) == 1  # what a SIGKILLed export leaves
    assert main(["export", str(folder), "--output", str(out)]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # the leftover removed, nothing else
    assert len((out / "vocab.txt").read_text().splitlines()) == json.loads((out / "config.json").read_text())[
        "vocab_size"]

    vocab = (folder / "vocab.txt").read_text()
    try:  # a vocab that is not the model's (as create-data into the run folder once left there)
        (folder / "vocab.txt").write_text(vocab + "".join(f"extra{i}\n" for i in range(100)))
        assert main(["export", str(folder), "--output", str(tmp_path / "other")]) == 2
        err = " ".join(capsys.readouterr().err.split())
        size = len(vocab.splitlines())
        assert f"has {size + 100} tokens but the model of run {folder} has vocab_size {size}" in err, err
    finally:
        (folder / "vocab.txt").write_text(vocab)

    config = (folder / "config.json").read_bytes()
    try:
        (folder / "config.json").unlink()
        assert main(["export", str(folder)]) == 2
        assert "holds a training run" in capsys.readouterr().err.replace("\n", " ")
        assert main(["export", str(folder), "--output", str(tmp_path / "again")]) == 2
        assert "but not its config.json" in capsys.readouterr().err
        if _tensorflow_installed():
            assert main(["evaluate", str(folder)]) == 2
            err = capsys.readouterr().err
            assert "but not its config.json" in err and "init_checkpoint" not in err, err
    finally:
        (folder / "config.json").write_bytes(config)
    assert not list(tmp_path.glob(".*"))


def _tensorflow_installed() -> bool:
    from tpu_pretrain.backend import tensorflow_installed

    return tensorflow_installed()


def test_a_corrupt_record_is_named_by_every_reader_of_shards(tmp_path):
    """The JAX trainer reads its batches here, a fresh run checks the token ids first (issue 37, item 11), evaluate
    reads the eval shards, data from other tools is read for its shapes: a damaged record is one message naming the
    shard, as on TensorFlow."""
    from tpu_pretrain.core.resolve import RunPlan
    from tpu_pretrain.data.data_folder import read_data_info, record_shapes
    from tpu_pretrain.errors import UserInputError
    from tpu_pretrain.export.evaluate import eval_batches as evaluate_batches
    from tpu_pretrain.jax_backend.input import TrainingBatches, eval_batches

    data = Path(sample_data(tmp_path, max_chars=20_000, num_shards=1, workers=1))
    for shard in data.glob("*.tfrecord"):  # one byte of every record's payload flipped: sizes and framing intact
        raw, pos = bytearray(shard.read_bytes()), 0
        while pos < len(raw):
            length = int.from_bytes(raw[pos:pos + 8], "little")
            raw[pos + 12 + length // 2] ^= 0xFF
            pos += 12 + length + 4
        shard.write_bytes(bytes(raw))
    info = read_data_info(str(data))
    batches = TrainingBatches(info.train_files, 4, info.max_seq_length, info.max_predictions_per_seq, seed=0)
    try:
        with pytest.raises(UserInputError, match=r"A shard in .* is corrupt \(.*record \d+ is corrupt.*\): "
                                                 r"train-00000-of-00001.tfrecord.* no longer match"):
            next(batches)
    finally:
        batches.close()
    with pytest.raises(UserInputError, match="eval-00000-of-00001.tfrecord"):
        list(eval_batches(info.eval_files, 1, info.max_seq_length, info.max_predictions_per_seq))
    one_message = r"A shard in .* is corrupt \(.*\): .*train-00000-of-00001.tfrecord.* no longer match.*Copy the data"
    with pytest.raises(UserInputError, match=one_message):
        RunPlan.resolve(Config.load(data_dir=str(data), output_dir=str(tmp_path / "run"), model_size="L2-H128"))
    with pytest.raises(UserInputError, match=one_message):
        list(evaluate_batches(info.eval_files, 1, info.max_seq_length, info.max_predictions_per_seq))
    with pytest.raises(UserInputError, match=one_message):
        record_shapes(info.train_files[0])
