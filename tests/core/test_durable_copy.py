"""Checkpoints that fit the free storage, and a durable copy that is never silently behind: the run core's loop,
checkpoints and mirror, for real, driven by a NumPy trainer of the core's protocol (no framework is needed to
save, copy, prune, fail, stop and resume), against a Drive-like place with a byte budget and a bin
(:mod:`drive_double`), read-only folders and the Cloud Storage emulator; and once through the real command line."""

import contextlib
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from drive_double import drive_in_use
from fault_injection import ENV, sample_data
from numpy_trainer import NumpyTrainer
from storage_emulator import free_port

from tpu_pretrain.config import Config
from tpu_pretrain.core.checkpoint_space import place
from tpu_pretrain.core.checkpoints import CheckpointError, find_checkpoint
from tpu_pretrain.core.loop import run_training
from tpu_pretrain.core.mirror import CheckpointMirror, fetch_run, mirror_state
from tpu_pretrain.core.run_folder import RunFolder
from tpu_pretrain.core.status import run_status
from tpu_pretrain.errors import UserInputError
from tpu_pretrain.jax_backend.state import read_arrays
from tpu_pretrain.storage import auth, drive

STEPS = 12


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return sample_data(tmp_path_factory.mktemp("durable_data"), workers=1)


def settings(data_dir, run, **overrides) -> Config:
    values = dict(data_dir=data_dir, output_dir=str(run), model_size="L2-H128", train_batch_size=8,
                  num_train_steps=STEPS, num_warmup_steps=2, save_checkpoints_steps=2, log_every_steps=2,
                  eval_every_steps=0, session_hours=-1, keep_checkpoint_max=2, mirror_keep=1, transfer_retries=0)
    return Config.load(**{**values, **overrides})


def train(config: Config, at_step: dict | None = None):
    trainer = NumpyTrainer(config, at_step=at_step)
    return run_training(trainer, config.storage.output_dir, progress=False), trainer


def saved_steps(run) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("ckpt-*"))


@pytest.fixture(scope="module")
def reference(data_dir, tmp_path_factory):
    """The weights of an uninterrupted run without a durable copy."""
    _, trainer = train(settings(data_dir, tmp_path_factory.mktemp("reference") / "run"))
    return trainer.arrays["params/w"].copy()


def test_checkpoints_by_time_alone_and_the_final_save(data_dir, tmp_path):
    by_time = dict(save_checkpoints_steps=0, steps_per_execution=3, log_every_steps=3, keep_checkpoint_max=10)
    train(settings(data_dir, tmp_path / "often", save_checkpoints_minutes=1e-9, **by_time))
    assert saved_steps(tmp_path / "often") == [3, 6, 9, 12]  # every boundary, once the (tiny) interval passed
    train(settings(data_dir, tmp_path / "rarely", save_checkpoints_minutes=60, **by_time))
    assert saved_steps(tmp_path / "rarely") == [12]  # the end always saves


@pytest.mark.parametrize("signed_in", [True, False], ids=["deleted-for-good", "no-drive-sign-in"])
def test_a_run_that_would_fill_drive_keeps_within_it_and_its_copy_current(data_dir, tmp_path, caplog, signed_in):
    saves = 20
    with drive_in_use(tmp_path / "drive", budget=1_200_000, signed_in=signed_in) as double:
        (double.my_drive / "thesis.pdf").write_bytes(b"mine" * 2500)  # the user's own files, in Drive and its bin
        (double.bin / "old-photo.jpg").write_bytes(b"\1" * 50_000)
        stray = double.my_drive / "run" / "checkpoints" / "ckpt-000000001" / "notes.txt"
        stray.parent.mkdir(parents=True)
        stray.write_text("the user's notes, in a folder that looks like a checkpoint")
        caplog.set_level("INFO", logger="tpu_pretrain")
        config = settings(data_dir, tmp_path / "run", mirror_dir=str(double.my_drive / "run"),
                          num_train_steps=2 * saves)
        result, _ = train(config)

        assert result.stopped_reason is None and result.steps == 2 * saves
        size = sum(p.stat().st_size for p in (tmp_path / "run" / "checkpoints" / "ckpt-000000040").iterdir())
        assert saves * size > double.budget  # deleting into the bin would have filled it ten times over
        assert double.peak <= double.budget
        assert re.match(r"Checkpoints: about .* each\. Run folder .*Durable copy .* \(Google Drive: its bin counts as "
                        r"used\): 3 fit in .*; keeping 1 \(2 while copying\) leaves", next(
                            line for line in caplog.messages if line.startswith("Checkpoints:")))
        # Never more than mirror_max_lag=2 saves (of 2 steps) behind, besides the save the line comes before.
        lags = [int(s) - int(d) for s, d in re.findall(r"step (\d+)/40: .*; durable step (\d+)", caplog.text)]
        assert len(lags) >= saves - 3 and max(lags) <= 6 and "failed" not in caplog.text
        copy = double.my_drive / "run" / "checkpoints"
        assert sorted(p.name for p in copy.iterdir()) == ["ckpt-000000001", "ckpt-000000040", "latest"]
        assert find_checkpoint(copy).step == 40
        # The user's files are as they were; the bin holds nothing of the checkpoints' bytes.
        assert (double.my_drive / "thesis.pdf").read_bytes() == b"mine" * 2500 and stray.is_file()
        binned = double.bin_files()
        assert binned.pop("old-photo.jpg") == 50_000 and not any(binned.values())
        pruned = 2 * (sum(m.startswith("Durable copy: ckpt-") for m in caplog.messages) - 1)  # two files each
        if signed_in:
            assert not binned and sorted(set(double.deleted_for_good)) == ["checkpoint.json", "state.npz"]
            assert len(double.deleted_for_good) == pruned
        else:
            assert len(binned) == pruned and not double.deleted_for_good  # emptied, then deleted


def test_a_run_folder_on_drive_prunes_for_good_too(data_dir, tmp_path):
    with drive_in_use(tmp_path / "drive", budget=1_500_000) as double:
        result, _ = train(settings(data_dir, double.my_drive / "run"))  # 6 saves, 2 kept
        assert result.stopped_reason is None and saved_steps(double.my_drive / "run") == [10, 12]
        assert not double.bin_files() and len(double.deleted_for_good) == 4 * 2 and double.peak <= double.budget


@contextlib.contextmanager
def failing_place(cause, tmp_path, request):
    """A durable place that fails for ``cause``; yields its URL and the fix, then cleans up."""
    if cause == "quota":
        with drive_in_use(tmp_path / "drive", budget=1_000_000) as double:
            double.upload_later("phone-backup.zip", 800_000)  # the user's other devices fill Drive meanwhile
            yield str(double.my_drive / "run"), lambda: (double.my_drive / "phone-backup.zip").unlink()
    elif cause == "permissions":
        folder = tmp_path / "read-only"
        folder.mkdir()
        with read_only(folder) as make_writable:
            yield str(folder / "run"), make_writable
    else:
        emulator, bucket = request.getfixturevalue("emulator"), request.getfixturevalue("bucket")
        monkeypatch = request.getfixturevalue("monkeypatch")
        monkeypatch.setenv("TPU_PRETRAIN_GCS_RETRY_SECONDS", "1")
        emulator.kill()
        def repair():  # the service is back: calls get their usual deadline, not the 1 s that made the outage quick
            emulator.restart()
            monkeypatch.setenv("TPU_PRETRAIN_GCS_RETRY_SECONDS", "30")

        try:
            yield f"gs://{bucket}/run", repair
        finally:
            if emulator.process is None or emulator.process.poll() is not None:
                emulator.restart()


@contextlib.contextmanager
def read_only(folder):
    """Make ``folder`` read-only (a read-only tmpfs for root, whom permissions do not stop); yields the fix."""
    if os.geteuid() == 0:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=512m", "tmpfs", str(folder)], check=True)
        try:
            yield lambda: subprocess.run(["mount", "-o", "remount,rw", str(folder)], check=True)
        finally:
            subprocess.run(["umount", "-l", str(folder)], check=False)
    else:
        folder.chmod(0o555)
        try:
            yield lambda: folder.chmod(0o755)
        finally:
            folder.chmod(0o755)


@pytest.mark.parametrize("cause, says, fix", [
    ("quota", "no room", "empty its bin"),
    ("permissions", "no permission to write", "writable"),
    ("network", "the network or the storage service is unreachable", "network connection"),
])
def test_a_failing_copy_stops_training_within_the_lag_saying_why_and_resuming_is_exact(
        cause, says, fix, data_dir, tmp_path, reference, request, caplog):
    run = tmp_path / "run"
    caplog.set_level("INFO", logger="tpu_pretrain")
    with failing_place(cause, tmp_path, request) as (url, repair):
        result, _ = train(settings(data_dir, run, mirror_dir=url))
        # Saves at 2 and 4 were not copied; at 6 the copy would be 3 behind (more than mirror_max_lag=2): stop.
        assert result.steps == 6 and saved_steps(run)[-1] == 6
        assert result.stopped_reason.startswith(f"the durable copy at {url} is 3 checkpoints behind the run: {says}")
        stop = next(line for line in caplog.messages if "Training saved step 6" in line)
        assert f"The durable copy at {url} is 3 checkpoints behind the run (newest there: none): {says}" in stop
        assert fix in stop and "run the same command again" in stop
        assert re.search(r"step 6/12: .*; durable none yet, 2 behind", caplog.text)  # the progress line says so
        status = run_status(run)
        assert "behind the newest local checkpoint (step 6)" in status and f"last attempt failed ({says}" in status

        repair()
        auth.reset()  # the same command again is a new process: no connection pooled to the service that went away
        caplog.clear()
        result, trainer = train(settings(data_dir, run, mirror_dir=url))
    assert result.stopped_reason is None and result.steps == STEPS
    # The copy catches up (step 6's copy before step 8 is not checked: since the copy's first pass starts by checking
    # whose copy it is, it sometimes fails once against the just-restarted emulator, and the next pass copies 8).
    assert "Durable copy: ckpt-000000012" in caplog.text
    np.testing.assert_array_equal(trainer.arrays["params/w"], reference)  # exactly the uninterrupted run
    if cause == "network":  # a fresh runtime brings the run back from its durable copy
        assert fetch_run(url, tmp_path / "fresh")
        assert find_checkpoint(tmp_path / "fresh" / "checkpoints").step == STEPS
        np.testing.assert_array_equal(read_arrays(tmp_path / "fresh" / "checkpoints" / "ckpt-000000012")["params/w"],
                                      reference)
        auth.reset()


def test_a_copy_that_recovers_catches_up_before_the_next_save(data_dir, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(CheckpointMirror, "retry_seconds", 0.0)
    caplog.set_level("INFO", logger="tpu_pretrain")
    folder, run = tmp_path / "read-only", RunFolder(tmp_path / "run")
    folder.mkdir()

    def until(recorded):  # what the copy's last pass recorded (bounded: a copy that never gets there fails)
        deadline = time.monotonic() + 120
        while not recorded(mirror_state(run) or {}) and time.monotonic() < deadline:
            time.sleep(0.01)

    with read_only(folder) as repair:
        config = settings(data_dir, run.path, mirror_dir=str(folder / "run"), save_checkpoints_steps=6,
                          log_every_steps=1)
        at_step = {7: lambda: (until(lambda state: state.get("error")), repair()),  # the copy of 6 failed; fixed
                   10: lambda: until(lambda state: state.get("durable_step") == 6)}
        result, _ = train(config, at_step)
    assert result.stopped_reason is None
    messages = caplog.messages
    caught_up = messages.index(next(m for m in messages if m.startswith("Durable copy: ckpt-000000006")))
    saved = messages.index(next(m for m in messages if m.startswith("Saved checkpoint") and "ckpt-000000012" in m))
    assert caught_up < saved  # retried between the saves, not at the next one
    assert sum("failed (no permission to write)" in m for m in messages) == 1  # said once, not at every retry


def test_with_mirror_failure_continue_training_goes_on_and_says_so(data_dir, tmp_path, caplog):
    folder = tmp_path / "read-only"
    folder.mkdir()
    with read_only(folder):
        result, _ = train(settings(data_dir, tmp_path / "run", mirror_dir=str(folder / "run"),
                                   mirror_failure="continue"))
    assert result.stopped_reason is None and result.steps == STEPS
    assert "Training goes on (--mirror_failure continue): a disconnect now loses every step after none" in caplog.text


def files_of(folder) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_run_never_adopts_or_prunes_another_runs_durable_copy(data_dir, tmp_path, caplog):
    """Issue 37, items 1 and 6: run B given run A's mirror_dir neither resumes from A's checkpoints nor prunes
    them, whatever its steps (the refusal is about the run, not A's learning rate); A, and a fresh runtime with
    A's settings, continue A from it."""
    mirror, a = tmp_path / "mirror", tmp_path / "a"
    train(settings(data_dir, a, mirror_dir=str(mirror), mirror_keep=3))
    durable = files_of(mirror)
    assert len(saved_steps(mirror)) == 3 and saved_steps(mirror)[-1] == 12 and "run.json" in durable
    train(settings(data_dir, tmp_path / "c", num_train_steps=2))  # a run of its own, started without a mirror
    for run, overrides in [("b", dict(num_train_steps=4)), ("b", dict(num_train_steps=24)),
                           ("b", dict(num_train_steps=24, rewarm_steps=2)), ("c", dict(train_seed=0))]:
        config = settings(data_dir, tmp_path / run, mirror_dir=str(mirror), mirror_keep=3,
                          **{"train_seed": 9, **overrides})
        with pytest.raises(UserInputError) as refused:
            train(config)
        said = " ".join(str(refused.value).split())
        assert f"The durable copy at {mirror} holds the checkpoints of another run (run " in said, said
        assert f"output_dir {a}; up to step 12;" in said and f"in {tmp_path / run}." in said
        assert "nothing was fetched or deleted" in said and f"--output_dir {a}" in said
        assert "--mirror_dir of its own" in said and "decayed" not in said
        assert ("train_seed: 0 in the run, 9 now" in said) == (run == "b")
        assert files_of(mirror) == durable  # A's durable checkpoints, all kept
    assert not saved_steps(tmp_path / "b") and saved_steps(tmp_path / "c") == [2]
    caplog.set_level("INFO", logger="tpu_pretrain")
    result, _ = train(settings(data_dir, a, mirror_dir=str(mirror), mirror_keep=3, num_train_steps=14, rewarm_steps=2))
    assert result.steps == 14 and "Resuming from" in caplog.text
    fresh = tmp_path / "fresh"  # a new runtime: an empty folder, A's settings
    result, _ = train(settings(data_dir, fresh, mirror_dir=str(mirror), mirror_keep=3, num_train_steps=16,
                               rewarm_steps=2))
    assert result.steps == 16 and "Fetched checkpoint ckpt-000000014" in caplog.text
    assert (fresh / "run.json").read_bytes() == (a / "run.json").read_bytes()
    with pytest.raises(UserInputError, match="holds another run than the one at"):
        fetch_run(str(mirror), tmp_path / "c")  # nor is another run's folder mixed with it


def test_a_garbled_run_json_an_old_copy_and_a_run_folder_given_as_the_copy(data_dir, tmp_path, caplog):
    """Issue 45, item 20: a copy's run.json that cannot be read is refused in one line with the fix; a copy written
    before run ids (no run.json) continues its own run from a fresh folder; another run's own output_dir is no
    durable copy."""
    mirror, a = tmp_path / "mirror", tmp_path / "a"
    train(settings(data_dir, a, mirror_dir=str(mirror), num_train_steps=4))
    (mirror / "run.json").write_text('{"run_id": "4f2a", "crea')
    with pytest.raises(UserInputError) as refused:
        train(settings(data_dir, a, mirror_dir=str(mirror), num_train_steps=6, rewarm_steps=2))
    said = str(refused.value)
    assert f"The durable copy's run.json at {mirror / 'run.json'} is unreadable" in said and "\n" not in said
    assert f"copy {a / 'run.json'} over it" in said and "Expecting" not in said and "char" not in said
    (mirror / "run.json").unlink()  # as a copy from before run ids left it
    caplog.set_level("INFO", logger="tpu_pretrain")
    fresh = tmp_path / "fresh"  # a new runtime after an upgrade: an empty folder, the run's settings
    result, _ = train(settings(data_dir, fresh, mirror_dir=str(mirror), num_train_steps=6, rewarm_steps=2))
    assert result.steps == 6 and "Fetched checkpoint ckpt-000000004" in caplog.text
    assert (mirror / "run.json").read_bytes() == (fresh / "run.json").read_bytes()  # the copy names its run now
    (mirror / "run.json").unlink()
    with pytest.raises(UserInputError) as refused:  # another run's settings: still refused
        train(settings(data_dir, tmp_path / "seed", mirror_dir=str(mirror), num_train_steps=8, train_seed=9))
    assert "train_seed: 0 in the run, 9 now" in str(refused.value)
    before = files_of(a)
    with pytest.raises(UserInputError) as refused:  # run a's own folder given as b's durable copy
        train(settings(data_dir, tmp_path / "b", mirror_dir=str(a), num_train_steps=4))
    said = str(refused.value)
    assert f"--mirror_dir {a} is the output_dir of a run (its config.json names that folder as its own)" in said
    assert f"to continue that run, train with --output_dir {a}" in said
    assert files_of(a) == before and not saved_steps(tmp_path / "b")


def test_a_keep_that_does_not_fit_is_refused_before_the_first_step(data_dir, tmp_path):
    with drive_in_use(tmp_path / "drive", budget=1_000_000) as double:
        with pytest.raises(CheckpointError, match=r"mirror_keep=2 needs room for 3 .* has .* free, .* room for 2\. "
                                                  r"Nothing was trained; lower --mirror_keep to 1, or free at least "
                                                  r".* there and empty its bin"):
            train(settings(data_dir, tmp_path / "run", mirror_dir=str(double.my_drive / "run"), mirror_keep=2))
    assert not saved_steps(tmp_path / "run")


def test_kaggle_output_holds_at_most_20_gb(tmp_path, monkeypatch):
    working = tmp_path / "kaggle" / "working"
    (working / "data").mkdir(parents=True)
    (working / "data" / "shard").write_bytes(b"\0" * 4096)
    monkeypatch.setattr(drive, "KAGGLE_WORKING", str(working))
    assert drive.free_space(working / "runs" / "bert") <= drive.KAGGLE_WORKING_LIMIT - 4096
    assert place(str(working / "runs")) == "Kaggle's output: at most 20 GB"


@pytest.mark.slow
def test_the_command_line_exits_75_saying_what_failed(data_dir, tmp_path):
    """The real `tpu-pretrain train` (JAX backend) with an unreachable durable copy: exit 75, the cause and the fix."""
    env = {**ENV, "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{free_port()}", "TPU_PRETRAIN_GCS_RETRY_SECONDS": "1"}
    command = [sys.executable, "-m", "tpu_pretrain", "train", "--backend", "jax", "--data_dir", data_dir,
               "--output_dir", str(tmp_path / "run"), "--model_size", "L2-H128", "--train_batch_size", "8",
               "--num_train_steps", "12", "--num_warmup_steps", "2", "--save_checkpoints_steps", "2",
               "--log_every_steps", "2", "--eval_every_steps", "0", "--max_eval_steps", "1", "--steps_per_execution",
               "1", "--session_hours", "-1", "--mirror_dir", "gs://unreachable-bucket/run", "--transfer_retries", "0"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 75, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "The durable copy at gs://unreachable-bucket/run is 3 checkpoints behind the run" in done.stderr
    assert "Check this machine's network connection" in done.stderr
    assert "Stopped early (the durable copy at gs://unreachable-bucket/run is 3 checkpoints behind" in done.stdout
    assert saved_steps(tmp_path / "run")[-1] == 6
