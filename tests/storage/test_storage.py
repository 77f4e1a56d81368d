"""Storage against a real Cloud Storage API server (gcp-storage-emulator in a subprocess), no mocks.

Covers the issue's checks: nested folder round trip, a re-run that transfers nothing, a changed
file re-sent, resumable chunks, the server killed mid-upload and restarted, a corrupted download,
a missing bucket and a permission error (HTTP 403 from a proxy: the emulator enforces no IAM).
"""

from __future__ import annotations

import filecmp
import json
import os
import threading
from pathlib import Path

import pytest
from storage_emulator import DenyingProxy, Emulator, is_write, use_emulator

from tpu_pretrain import storage
from tpu_pretrain.storage import auth, checksums, drive, gcs
from tpu_pretrain.storage.errors import redact
from tpu_pretrain.storage.security import check_storage
from tpu_pretrain.storage.transfer import TransferOptions, transfer

KiB, MiB = 1024, 1024 * 1024
FAST = dict(progress=False, retries=1, backoff=0.01, chunk_size=256 * KiB, resumable_threshold=1 * MiB)


def make_tree(root: Path) -> dict[str, bytes]:
    files = {
        "vocab.txt": b"[PAD]\n[UNK]\n",
        "empty.txt": b"",
        "data/train-00000.tfrecord": os.urandom(70 * KiB),
        "data/eval/eval-00000.tfrecord": os.urandom(33 * KiB),
        "data/eval/deep/er/manifest.json": json.dumps({"shards": 2}).encode(),
        "données/ünïcode 文件.txt": "héllo 世界".encode(),
    }
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def object_crcs(url: str) -> dict[str, str]:
    return {info.rel: info.crc32c for info in storage.GcsBackend().list(url)}


def test_folder_round_trip_nested(bucket, tmp_path):
    files = make_tree(tmp_path / "src")
    dest = f"gs://{bucket}/run1"
    up = transfer(str(tmp_path / "src"), dest, TransferOptions(**FAST))
    assert up.ok and len(up.sent) == len(files) and not up.skipped, up.text()
    crcs = object_crcs(dest)
    assert crcs == {rel: checksums.crc32c_bytes(data) for rel, data in files.items()}
    down = transfer(dest, str(tmp_path / "back"), TransferOptions(**FAST))
    assert down.ok and len(down.sent) == len(files), down.text()
    for rel, data in files.items():
        assert (tmp_path / "back" / rel).read_bytes() == data
    assert not [p for p in (tmp_path / "back").rglob("*") if ".tpu-pretrain-tmp-" in p.name]
    assert "sent" in up.text() and "skipped" in up.text() and "failed" in up.text()


def test_rerun_transfers_nothing_and_changed_file_is_resent(bucket, tmp_path):
    files = make_tree(tmp_path / "src")
    dest = f"gs://{bucket}/run"
    assert transfer(str(tmp_path / "src"), dest, TransferOptions(**FAST)).ok
    again = transfer(str(tmp_path / "src"), dest, TransferOptions(**FAST))
    assert (len(again.sent), len(again.skipped), again.bytes_sent) == (0, len(files), 0), again.text()

    # Same size, different bytes: only the crc32c can tell, and it must.
    shard = tmp_path / "src/data/train-00000.tfrecord"
    shard.write_bytes(os.urandom(70 * KiB))
    changed = transfer(str(tmp_path / "src"), dest, TransferOptions(**FAST))
    assert [Path(r.source).name for r in changed.sent] == ["train-00000.tfrecord"], changed.text()
    assert object_crcs(dest)["data/train-00000.tfrecord"] == checksums.crc32c_file(shard)

    assert transfer(dest, str(tmp_path / "back"), TransferOptions(**FAST)).ok
    back_again = transfer(dest, str(tmp_path / "back"), TransferOptions(**FAST))
    assert (len(back_again.sent), len(back_again.skipped)) == (0, len(files))
    (tmp_path / "back/vocab.txt").write_bytes(b"locally edited")
    fixed = transfer(dest, str(tmp_path / "back"), TransferOptions(**FAST))
    assert [Path(r.dest).name for r in fixed.sent] == ["vocab.txt"]
    assert (tmp_path / "back/vocab.txt").read_bytes() == files["vocab.txt"]


def test_large_file_goes_up_in_resumable_chunks(bucket, tmp_path):
    big = tmp_path / "model.ckpt.data"
    big.write_bytes(os.urandom(5 * MiB + 123))
    summary = transfer(str(big), f"gs://{bucket}/ckpt/", TransferOptions(**FAST))
    (result,) = summary.sent
    assert result.chunks == -(-big.stat().st_size // (256 * KiB))  # 21 chunks of 256 KiB
    assert result.dest == f"gs://{bucket}/ckpt/model.ckpt.data"
    assert object_crcs(f"gs://{bucket}/ckpt") == {"model.ckpt.data": checksums.crc32c_file(big)}
    storage.sync(result.dest, tmp_path / "copy.data", **FAST)
    assert filecmp.cmp(big, tmp_path / "copy.data", shallow=False)


def test_server_killed_mid_upload_then_rerun_completes(tmp_path, monkeypatch):
    emu = Emulator(tmp_path / "emu").start()
    try:
        use_emulator(emu.url, monkeypatch, tmp_path)
        auth.storage_client().create_bucket("crash-test")
        big = tmp_path / "shard.tfrecord"
        big.write_bytes(os.urandom(6 * MiB))
        dest = "gs://crash-test/data/shard.tfrecord"

        def kill_at_2mib(moved: int) -> None:
            if moved >= 2 * MiB:
                emu.kill()

        first = transfer(str(big), dest, TransferOptions(**{**FAST, "on_progress": kill_at_2mib}))
        (failure,) = first.failed
        assert dest in failure.error and "cannot reach" in failure.error, failure.error
        assert "upload_id=" not in failure.error or "upload_id=<redacted>" in failure.error

        emu.start()  # same port, same data folder
        auth.reset()
        assert not storage.exists(dest)  # nothing partial under the final name
        assert storage.list_files("gs://crash-test/data") == []

        second = transfer(str(big), dest, TransferOptions(**FAST))
        (result,) = second.sent
        assert result.bytes_sent <= 4 * MiB + 256 * KiB, "the re-run resumed instead of starting over"
        assert object_crcs(dest) == {"shard.tfrecord": checksums.crc32c_file(big)}
        assert storage.read_bytes(dest) == big.read_bytes()
        assert not list((tmp_path / "cache" / "uploads").glob("*.json"))  # session state cleaned up
    finally:
        emu.kill()
        auth.reset()


def test_short_outage_is_retried_with_backoff_in_the_same_run(tmp_path, monkeypatch):
    emu = Emulator(tmp_path / "emu").start()
    try:
        use_emulator(emu.url, monkeypatch, tmp_path)
        auth.storage_client().create_bucket("retry-test")
        big = tmp_path / "big.bin"
        big.write_bytes(os.urandom(3 * MiB))
        state = {"killed": False}

        def outage(moved: int) -> None:
            if moved >= 1 * MiB and not state["killed"]:
                state["killed"] = True
                emu.kill()
                threading.Timer(0.3, emu.start).start()

        options = TransferOptions(**{**FAST, "retries": 6, "backoff": 0.2, "on_progress": outage})
        summary = transfer(str(big), "gs://retry-test/big.bin", options)
        (result,) = summary.sent
        assert result.attempts > 1 and state["killed"]
        assert object_crcs("gs://retry-test/big.bin") == {"big.bin": checksums.crc32c_file(big)}
    finally:
        emu.kill()
        auth.reset()


def test_corrupted_download_is_detected(bucket, emulator, tmp_path):
    src = tmp_path / "shard.bin"
    src.write_bytes(os.urandom(300 * KiB))
    storage.sync(src, f"gs://{bucket}/data/shard.bin", **FAST)
    stored = emulator.object_file(bucket, "data/shard.bin")
    data = bytearray(stored.read_bytes())
    data[1000] ^= 0xFF  # bit rot: same size, different bytes, metadata crc32c unchanged
    stored.write_bytes(bytes(data))

    summary = transfer(f"gs://{bucket}/data", str(tmp_path / "down"), TransferOptions(**FAST))
    (failure,) = summary.failed
    assert f"gs://{bucket}/data/shard.bin" in failure.error and "crc32c" in failure.error, failure.error
    assert not (tmp_path / "down" / "shard.bin").exists()
    assert not list((tmp_path / "down").glob("*"))  # no temporary file left behind either
    with pytest.raises(storage.ChecksumMismatchError):
        storage.read_bytes(f"gs://{bucket}/data/shard.bin")


def test_missing_bucket_is_reported_clearly(bucket, tmp_path, capsys):
    make_tree(tmp_path / "src")
    with pytest.raises(storage.NotFoundError, match="bucket gs://no-such-bucket-42 does not exist"):
        transfer(str(tmp_path / "src"), "gs://no-such-bucket-42/run", TransferOptions(**FAST))
    with pytest.raises(storage.NotFoundError, match="does not exist"):
        transfer("gs://no-such-bucket-42/run", str(tmp_path / "down"), TransferOptions(**FAST))
    from tpu_pretrain.cli import main

    assert main(["upload", str(tmp_path / "src"), "gs://no-such-bucket-42/run"]) == 2
    err = capsys.readouterr().err
    assert "bucket gs://no-such-bucket-42 does not exist" in err and "Traceback" not in err


def test_permission_error_is_reported_clearly(bucket, emulator, tmp_path, monkeypatch):
    (tmp_path / "weights.bin").write_bytes(os.urandom(2 * MiB))
    with DenyingProxy(emulator.url, deny=is_write) as proxy:
        use_emulator(proxy.url, monkeypatch, tmp_path)
        for name, threshold in (("small", 10 * MiB), ("resumable", 1 * MiB)):
            options = TransferOptions(**{**FAST, "resumable_threshold": threshold, "retries": 3})
            summary = transfer(str(tmp_path / "weights.bin"), f"gs://{bucket}/{name}/", options)
            (failure,) = summary.failed
            assert f"gs://{bucket}/{name}/weights.bin" in failure.error, failure.error
            assert "permission denied" in failure.error and "HTTP 403" in failure.error
            assert "storage.objects.create" in failure.error and "storage-check" in failure.error
            assert failure.attempts == 1  # a 403 is not retried
        with pytest.raises(storage.PermissionDeniedError):
            storage.write_text(f"gs://{bucket}/x.json", "{}")


def test_storage_check_warns_about_public_bucket_and_denied_writes(bucket, emulator, tmp_path, monkeypatch):
    clean = check_storage(f"gs://{bucket}/run", data_url=f"gs://{bucket}/data", run_url=f"gs://{bucket}/run")
    assert clean.ok and not clean.public, clean.text()
    assert {c.action for c in clean.access} >= {"list", "write", "delete"}
    assert not storage.list_files(f"gs://{bucket}/run")  # the write probe was deleted

    # Made public by the test itself, on a throwaway emulator bucket: the project never does this.
    b = auth.storage_client().bucket(bucket)
    policy = b.get_iam_policy(requested_policy_version=3)
    policy.bindings.append({"role": "roles/storage.objectViewer", "members": {"allUsers"}})
    b.set_iam_policy(policy)
    report = check_storage(f"gs://{bucket}", data_url=f"gs://{bucket}/data", run_url=f"gs://{bucket}/run")
    text = report.text()
    assert not report.ok and "PUBLIC" in text and "allUsers has roles/storage.objectViewer" in text
    assert f"remove-iam-policy-binding gs://{bucket} --member=allUsers --role=roles/storage.objectViewer" in text
    assert "--public-access-prevention" in text
    assert f'startsWith("projects/_/buckets/{bucket}/objects/data/")' in text
    assert "roles/storage.objectUser" in text and "roles/storage.objectViewer" in text

    with DenyingProxy(emulator.url, deny=is_write) as proxy:
        use_emulator(proxy.url, monkeypatch, tmp_path)
        denied = check_storage(f"gs://{bucket}/run")
        (write,) = [c for c in denied.access if c.action == "write"]
        assert write.ok is False and "permission denied" in write.detail
        assert "DENIED" in denied.text()


def test_cli_upload_download_and_check(bucket, tmp_path, capsys):
    from tpu_pretrain.cli import main

    files = make_tree(tmp_path / "src")
    assert main(["upload", str(tmp_path / "src"), f"gs://{bucket}/cli", "--transfer_workers", "4"]) == 0
    assert f"{len(files)} sent" in capsys.readouterr().out
    assert main(["upload", str(tmp_path / "src"), f"gs://{bucket}/cli"]) == 0
    assert "0 sent" in capsys.readouterr().out
    assert main(["download", f"gs://{bucket}/cli", str(tmp_path / "down")]) == 0
    assert filecmp.dircmp(tmp_path / "src", tmp_path / "down").diff_files == []
    assert main(["storage-check", f"gs://{bucket}", "--data_dir", f"gs://{bucket}/cli"]) == 0
    assert "Public access: none found" in capsys.readouterr().out


def test_interface_over_local_and_gcs(bucket, tmp_path):
    for base in (str(tmp_path / "local"), f"gs://{bucket}/iface"):
        path = storage.join(base, "sub", "config.json")
        assert not storage.exists(path)
        storage.write_text(path, '{"a": 1}')
        assert storage.exists(path) and storage.read_text(path) == '{"a": 1}'
        assert storage.list_files(storage.join(base, "sub")) == [("config.json", 8)]
        storage.copy(path, storage.join(base, "copy.json"))
        assert storage.read_text(storage.join(base, "copy.json")) == '{"a": 1}'
        storage.delete(storage.join(base, "sub"), recursive=True)
        assert not storage.exists(path)
        with pytest.raises(storage.NotFoundError):
            storage.read_bytes(path)
    assert storage.free_space(tmp_path) > 0 and storage.free_space(f"gs://{bucket}/x") is None


def test_local_writes_are_atomic_and_check_free_space(tmp_path):
    target = tmp_path / "ckpt" / "weights.bin"
    storage.write_bytes(target, b"old")
    with pytest.raises(RuntimeError):
        with storage.atomic_open(target) as f:
            f.write(b"half of the new")
            raise RuntimeError("crash mid-write")
    assert target.read_bytes() == b"old" and os.listdir(target.parent) == ["weights.bin"]
    free = drive.free_space(tmp_path)
    with pytest.raises(storage.InsufficientSpaceError, match=r"needs .* but only .* is free; free at least"):
        storage.ensure_free_space(tmp_path, free * 2, what="checkpoint ckpt-1000")
    with pytest.raises(storage.InsufficientSpaceError):
        with storage.atomic_open(target, expected_size=free * 2):
            pass
    assert target.read_bytes() == b"old"


def test_drive_paths_need_a_mount(monkeypatch):
    monkeypatch.setattr(drive, "is_mounted", lambda root=drive.DRIVE_ROOT: False)
    with pytest.raises(storage.StorageError, match="drive.mount"):
        storage.write_text("/content/drive/MyDrive/run/config.json", "{}")
    with pytest.raises(storage.StorageError, match="not a Colab runtime"):
        drive.ensure_drive_ready("/content/drive/MyDrive/run", mount=True)
    msg = ""
    try:
        drive.ensure_free_space("/content/drive/MyDrive/run", 10**18, what="checkpoint")
    except storage.InsufficientSpaceError as exc:
        msg = str(exc)
    assert not msg or "trash" in msg


def test_credentials_are_never_shown(tmp_path, monkeypatch):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    info = {"type": "service_account", "project_id": "p", "private_key_id": "abc", "private_key": pem,
            "client_email": "trainer@p.iam.gserviceaccount.com", "client_id": "1",
            "token_uri": "https://oauth2.googleapis.com/token"}
    key_file = tmp_path / "key.json"
    key_file.write_text(json.dumps(info))
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key_file))
    credentials, project = auth.get_credentials()
    assert auth.describe(credentials) == "service account trainer@p.iam.gserviceaccount.com"
    assert auth.member(credentials) == "serviceAccount:trainer@p.iam.gserviceaccount.com"

    key_file.write_text(json.dumps({**info, "private_key": pem[:200] + "garbage"}))
    with pytest.raises(storage.StorageError) as err:
        auth.get_credentials()
    assert "PRIVATE KEY" not in str(err.value) and pem[40:80] not in str(err.value)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(storage.StorageError, match="does not exist"):
        auth.get_credentials()
    assert redact("http://h/upload?uploadType=resumable&upload_id=SECRET123&x=1") == (
        "http://h/upload?uploadType=resumable&upload_id=<redacted>&x=1")


def test_large_file_moves_as_parallel_slices_and_an_interrupted_upload_reuses_its_parts(bucket, tmp_path):
    from tpu_pretrain.storage import sliced

    big = tmp_path / "shard.tfrecord"
    big.write_bytes(os.urandom(6 * MiB + 77))
    options = TransferOptions(**{**FAST, "workers": 4, "parallel_threshold": 2 * MiB, "slice_size": 1 * MiB})
    dest = f"gs://{bucket}/data/shard.tfrecord"
    crc = checksums.crc32c_file(big)

    # A first attempt dies after a few parts: the parts stay, the final name shows nothing.
    def die_after_two_mib(position: int) -> None:
        if position >= 2 * MiB:
            raise ConnectionError("connection dropped")

    with pytest.raises(Exception, match="connection dropped"):
        sliced.composite_upload(str(big), storage.GcsPath.parse(dest), crc, big.stat().st_size, 1, 1 * MiB,
                                die_after_two_mib)
    assert not storage.exists(dest) and storage.list_files(f"gs://{bucket}/data") == []  # parts are hidden

    summary = transfer(str(big), dest, options)
    (result,) = summary.sent
    assert result.bytes_sent < big.stat().st_size  # the parts already there were not sent again
    assert object_crcs(f"gs://{bucket}/data") == {"shard.tfrecord": crc}
    leftovers = [b.name for b in auth.storage_client().list_blobs(bucket) if gcs.PART_MARK in b.name]
    assert leftovers == []

    down = transfer(dest, str(tmp_path / "back.tfrecord"), options)
    assert down.ok and filecmp.cmp(big, tmp_path / "back.tfrecord", shallow=False)
    assert transfer(dest, str(tmp_path / "back.tfrecord"), options).skipped  # identical: skipped


def test_corrupted_object_fails_a_ranged_download_without_a_partial_file(bucket, emulator, tmp_path):
    big = tmp_path / "ckpt.data"
    big.write_bytes(os.urandom(3 * MiB))
    options = TransferOptions(**{**FAST, "workers": 4, "parallel_threshold": 1 * MiB, "slice_size": 512 * KiB})
    assert transfer(str(big), f"gs://{bucket}/c/ckpt.data", options).ok
    stored = emulator.object_file(bucket, "c/ckpt.data")
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0xFF
    stored.write_bytes(bytes(data))
    result = transfer(f"gs://{bucket}/c/ckpt.data", str(tmp_path / "out" / "ckpt.data"), options)
    assert not result.ok and "crc32c" in result.text()
    assert not (tmp_path / "out" / "ckpt.data").exists() and not list((tmp_path / "out").glob("*tmp*"))


# -- locations and a machine without a network, through the command line --------------------------------
def cli(*args, cwd=None, env=None, timeout=120):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "tpu_pretrain", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=timeout)


def test_unsupported_locations_are_refused_not_made_local_folders(tmp_path):
    (tmp_path / "d1").mkdir()
    (tmp_path / "d1" / "a.txt").write_text("data")
    for args, says in [(["upload", "d1", "gs:/bucket/x"], "Did you mean gs://bucket/x?"),
                       (["upload", "d1", "s3://bucket/x"], "'s3:' is not a supported location"),
                       (["download", "http://example.com/x", "d2"], "'http:' is not a supported location"),
                       (["train", "--mirror_dir", "gs:/bucket/run", "--output_dir", "run"], "mirror_dir"),
                       (["train", "--mirror_dir", "s3://bucket/run", "--output_dir", "run"], "gs://BUCKET/PATH")]:
        done = cli(*args, cwd=tmp_path)
        assert done.returncode == 2 and says in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
    assert sorted(os.listdir(tmp_path)) == ["d1"]  # no folder called gs:, s3: or http:


def offline_key(tmp_path) -> tuple[Path, str]:
    """A well-formed service-account key whose token endpoint is a closed port on loopback (no network)."""
    import socket

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{probe.getsockname()[1]}/token"
    key = tmp_path / "key.json"
    key.write_text(json.dumps({"type": "service_account", "project_id": "p", "private_key_id": "k", "private_key": pem,
                               "client_email": "trainer@p.iam.gserviceaccount.com", "client_id": "1",
                               "token_uri": endpoint}))
    return key, endpoint


def test_without_a_network_every_command_fails_at_once_in_one_line(tmp_path):
    import time

    key, endpoint = offline_key(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "STORAGE_EMULATOR_HOST"}
    env["GOOGLE_APPLICATION_CREDENTIALS"] = str(key)
    (tmp_path / "d1").mkdir()
    (tmp_path / "d1" / "a.txt").write_text("data")
    for args in (["storage-check", "gs://tpu-pretrain-test"], ["upload", "d1", "gs://tpu-pretrain-test/x"],
                 ["download", "gs://tpu-pretrain-test/x", "d2"]):
        started = time.monotonic()
        done = cli(*args, cwd=tmp_path, env=env)
        seconds = time.monotonic() - started
        assert done.returncode == 2 and seconds < 30, (args, seconds, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and not done.stdout.strip(), done.stderr
        assert f"Cannot get an access token for service account trainer@p.iam.gserviceaccount.com from {endpoint}" \
            in done.stderr and "Connection refused" in done.stderr
        assert "Retrying" not in done.stderr
    assert not (tmp_path / "d2").exists()
