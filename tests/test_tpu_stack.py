"""The TPU stack: the pinned sets, the checks of an installed environment, the diagnosis of every failure seen
in the wild (with faked site-packages, real lock-holding processes, faked Pythons and variables), the side
environment's code, and ``tpu-check`` run for real. The TPU environment's (make test-tpu-stack); the standard build
on a TPU VM: test_standard_build_on_a_tpu_vm.py."""

import base64
import configparser
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tpu_stack_processes import ROOT, import_tpu_pretrain, tpu_check

from tpu_pretrain import child_process, environment
from tpu_pretrain.pinned_sets import CPU_GPU_SET, TPU_SET, normalize, pins
from tpu_pretrain.runtime import COLAB, KAGGLE, LOCAL
from tpu_pretrain.tf_backend.setup import tpu_env
from tpu_pretrain.tf_backend.setup.tpu_diagnosis import (
    error_findings,
    lock_findings,
    no_tpu_finding,
    pjrt_findings,
    python_findings,
    stack_findings,
)
from tpu_pretrain.tf_backend.setup.tpu_stack import LIBTPU_FOR_TENSORFLOW_TPU, inspect_stack, report_offenders, tpu_pins

TPU_BUILD = environment.installed_version("tensorflow-tpu") is not None  # running in the TPU environment
TF_FILES = {"tensorflow/__init__.py": b"# tensorflow\n", "tensorflow/compiler/tf2xla/ops/_xla_ops.so": b"tpu" * 50,
            "tensorflow/python/_pywrap_tfe.so": b"a" * 64}


def fake_distribution(site: Path, name: str, version: str, files: dict[str, bytes] | None = None) -> None:
    """A wheel as pip leaves it: the files, and a dist-info with METADATA and a RECORD of their sha256 and sizes."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    rows = []
    for relative, content in (files or {}).items():
        path = site / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
        rows.append(f"{relative},sha256={digest},{len(content)}")
    rows.append(f"{info.name}/RECORD,,")
    (info / "RECORD").write_text("\n".join(rows) + "\n")


def tpu_site(tmp_path, libtpu="0.0.10", keras="2.19.0", tpu="2.19.1") -> Path:
    site = tmp_path / "site-packages"
    fake_distribution(site, "tensorflow-tpu", tpu, TF_FILES)
    if libtpu:
        fake_distribution(site, "libtpu", libtpu, {"libtpu/__init__.py": b"", "libtpu/libtpu.so": b"\x7fELF"})
    fake_distribution(site, "tf-keras", keras, {"tf_keras/__init__.py": b""})
    return site


# -- the pinned sets ----------------------------------------------------------------------------------
def test_the_pinned_sets_are_the_packages_files_and_tensorflow_is_an_extra():
    tpu, cpu = tpu_pins(), pins(CPU_GPU_SET)
    assert "tpu" in TPU_SET.name and "tensorflow-tpu==" in TPU_SET.read_text()
    assert LIBTPU_FOR_TENSORFLOW_TPU[tpu["tensorflow-tpu"]] == tpu["libtpu"]  # the pin follows the explicit map
    assert tpu["tf-keras"].split(".")[:2] == tpu["tensorflow-tpu"].split(".")[:2]
    assert cpu["tf-keras"].split(".")[:2] == cpu["tensorflow"].split(".")[:2]
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    requires = setup["options"]["install_requires"]
    assert "tensorflow" not in requires and "tf-keras" not in requires  # a TPU install never drags in the CPU build
    assert setup["options.extras_require"]["cpu"].strip() == "file: tpu_pretrain/requirements/cpu_gpu.txt"
    assert environment.BERT4KERAS_VERSION == "0.11.5"


def test_dry_run_reports_are_checked_for_other_tensorflow_builds():
    report = {"install": [{"metadata": {"name": "tensorflow_tpu", "version": "2.19.1"}},
                          {"metadata": {"name": "tf-keras", "version": "2.19.0"}},
                          {"metadata": {"name": "TensorFlow_CPU", "version": "2.19.1"}}]}
    assert report_offenders(report) == ["TensorFlow_CPU==2.19.1"]
    assert report_offenders({"install": report["install"][:2]}) == []


# -- an installed environment, faked -----------------------------------------------------------------
def test_a_sound_tpu_environment_has_no_findings(tmp_path):
    report = inspect_stack([str(tpu_site(tmp_path))], python="3.12")
    assert report.owners == ["tensorflow-tpu==2.19.1"] and report.record.checked == 3
    assert stack_findings(report) == [] and python_findings((3, 12)) == []


def test_another_build_written_over_the_tpu_build_is_found_by_name_and_by_hash(tmp_path):
    site = tpu_site(tmp_path)
    clobbered = dict(TF_FILES, **{"tensorflow/compiler/tf2xla/ops/_xla_ops.so": b"cpu" * 70})
    fake_distribution(site, "tensorflow-cpu", "2.19.1", clobbered)
    report = inspect_stack([str(site)], python="3.12")
    assert report.owners == ["tensorflow-cpu==2.19.1", "tensorflow-tpu==2.19.1"]
    causes = [f.cause for f in stack_findings(report)]
    assert any("tensorflow-cpu 2.19.1 is installed beside tensorflow-tpu 2.19.1" in c for c in causes)
    assert any("1 file(s)" in c and "_xla_ops.so" in c for c in causes)
    fix = stack_findings(report)[0].fix
    assert "pip uninstall -y tensorflow-cpu && pip install --force-reinstall --no-deps tensorflow-tpu==2.19.1" in fix


def test_a_clobber_that_keeps_file_sizes_needs_the_hashes_and_an_uninstall_leaves_files_missing(tmp_path):
    site = tpu_site(tmp_path)
    (site / "tensorflow/python/_pywrap_tfe.so").write_bytes(b"b" * 64)  # same size, other bytes
    assert inspect_stack([str(site)], hashes=False).record.ok
    report = inspect_stack([str(site)])
    assert report.record.modified == ["tensorflow/python/_pywrap_tfe.so"] and not report.other_builds
    assert "differ from the hashes" in stack_findings(report)[0].cause
    (site / "tensorflow/compiler/tf2xla/ops/_xla_ops.so").unlink()  # what `pip uninstall tensorflow` does
    assert inspect_stack([str(site)]).record.missing == ["tensorflow/compiler/tf2xla/ops/_xla_ops.so"]


@pytest.mark.parametrize("libtpu, expected", [("0.0.10.1", "libtpu 0.0.10.1 is installed, but tensorflow-tpu 2.19.1 "
                                                            "needs libtpu 0.0.10"),
                                              ("0.0.52", "needs libtpu 0.0.10"),
                                              (None, "libtpu is not installed, but")])
def test_libtpu_must_be_the_one_the_map_names(tmp_path, libtpu, expected):
    findings = stack_findings(inspect_stack([str(tpu_site(tmp_path, libtpu=libtpu))]))
    assert len(findings) == 1 and expected in findings[0].cause and findings[0].fix == "pip install libtpu==0.0.10"


def test_releases_outside_the_map(tmp_path):
    old = stack_findings(inspect_stack([str(tpu_site(tmp_path / "a", libtpu="2.18.0", keras="2.18.0",
                                                     tpu="2.18.0"))]))
    assert old == []  # 2.18.0 with its own libtpu is consistent (only its libtpu is not on PyPI)
    new = stack_findings(inspect_stack([str(tpu_site(tmp_path / "b", libtpu="0.0.52", keras="2.20.1",
                                                     tpu="2.20.0"))]))
    assert "cannot run on the free TPUs" in new[0].cause and "ConfigureDistributedTpuOp_DoWork" in new[0].cause


def test_tf_keras_of_another_minor_version_beside_the_tpu_build(tmp_path):
    findings = stack_findings(inspect_stack([str(tpu_site(tmp_path, keras="2.21.0"))]))
    assert "tf-keras 2.21.0 does not match tensorflow-tpu 2.19.1" in findings[0].cause
    assert "--no-deps tf-keras==2.19.0" in findings[0].fix


def test_an_image_with_only_tensorflow_cpu_as_on_kaggle(tmp_path):
    site = tmp_path / "site-packages"
    fake_distribution(site, "tensorflow-cpu", "2.20.0", TF_FILES)
    findings = stack_findings(inspect_stack([str(site)]))
    assert "tensorflow-tpu is not installed in this environment (tensorflow-cpu 2.20.0)" in findings[0].cause
    assert "tpu_env.run_tpu_pretrain" in findings[0].fix


def test_a_python_too_new_for_any_tensorflow_tpu_wheel():
    finding, = python_findings((3, 13))
    assert "Python 3.13 is too new" in finding.cause and "3.10, 3.11, 3.12" in finding.cause
    assert "Runtime version" in finding.fix and "uv" in finding.fix
    assert "too old" in python_findings((3, 9))[0].cause


def test_pjrt_variables_missing_or_wrong_when_tensorflow_was_imported(tmp_path):
    library = tmp_path / "libtpu.so"
    library.write_bytes(b"\x7fELF")
    good = {"PJRT_DEVICE": "TPU", "NEXT_PLUGGABLE_DEVICE_USE_C_API": "true",
            "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": str(library)}
    assert pjrt_findings(good) == []
    missing, = pjrt_findings({"PJRT_DEVICE": "TPU"})
    assert "missing NEXT_PLUGGABLE_DEVICE_USE_C_API, TF_PLUGGABLE_DEVICE_LIBRARY_PATH" in missing.cause
    assert "import tpu_pretrain before TensorFlow" in missing.fix
    wrong, = pjrt_findings(dict(good, PJRT_DEVICE="CPU", TF_PLUGGABLE_DEVICE_LIBRARY_PATH="/gone/libtpu.so"))
    assert "PJRT_DEVICE=CPU" in wrong.cause and "/gone/libtpu.so (no such file)" in wrong.cause


# -- the package sets TensorFlow's TPU variables itself ---------------------------------------------------
def test_on_a_tpu_vm_the_package_sets_the_pjrt_variables_for_its_own_libtpu(tmp_path):
    site = tpu_site(tmp_path)
    shown = import_tpu_pretrain(site, ISTPUVM="1", TPU_LIBRARY_PATH="/usr/lib/jax/libtpu.so",
                                TF_XLA_FLAGS="--xla_foo")
    library = str(site / "libtpu" / "libtpu.so")
    assert shown["env"]["PJRT_DEVICE"] == "TPU" and shown["env"]["NEXT_PLUGGABLE_DEVICE_USE_C_API"] == "true"
    assert shown["env"]["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] == library == shown["env"]["TPU_LIBRARY_PATH"]
    assert shown["env"]["TF_XLA_FLAGS"] == "--xla_foo --tf_mlir_enable_mlir_bridge=true"
    assert shown["env"]["TPU_LOAD_LIBRARY"] is None and shown["at_import"]["PJRT_DEVICE"] == "TPU"


def test_off_a_tpu_vm_the_tpu_build_is_told_not_to_look_for_a_tpu(tmp_path):
    shown = import_tpu_pretrain(tpu_site(tmp_path))
    assert shown["env"]["TPU_LOAD_LIBRARY"] == "0" and shown["env"]["PJRT_DEVICE"] is None


def test_tensorflow_imported_first_is_remembered_for_the_diagnosis(tmp_path):
    shown = import_tpu_pretrain(tpu_site(tmp_path), "tensorflow-first", ISTPUVM="1")
    assert shown["env"]["PJRT_DEVICE"] == "TPU"  # set, but too late for the TensorFlow already loaded
    assert not any(shown["at_import"].values())
    assert "missing PJRT_DEVICE" in pjrt_findings(shown["at_import"])[0].cause


# -- the TPU held by another process, and a stale lock file (real processes) -----------------------------
HOLD = textwrap.dedent("""
    import fcntl, sys, time
    handle = open(sys.argv[1], "a+")
    if sys.argv[2] == "lock":
        fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("holding", flush=True)
    time.sleep(120)
""")


def hold(path: Path, how: str) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(path), how], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "holding"
    return process


def test_a_lock_held_by_a_live_process_names_its_pid_and_a_dead_ones_lock_is_stale(tmp_path):
    lock = tmp_path / "libtpu_lockfile"
    holder = hold(lock, "lock")
    try:
        finding, = lock_findings(str(lock), devices=())
        assert f"pid {holder.pid} (" in finding.cause and "HOLD" not in finding.cause
        assert f"kill {holder.pid}" in finding.fix
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert lock.exists() and lock_findings(str(lock), devices=()) == []  # libtpu takes an unheld file over
    stale, = lock_findings(str(lock), devices=(), error_text="Internal error when accessing libtpu multi-process "
                                                             "lockfile. Run \"$ sudo rm /tmp/libtpu_lockfile\".")
    assert "is stale: no process holds it" in stale.cause and stale.fix == f"rm {lock}"


def test_a_process_with_the_tpu_device_open_is_named(tmp_path):
    device = tmp_path / "accel0"
    device.write_bytes(b"")
    user = hold(device, "open")
    try:
        finding, = lock_findings(str(tmp_path / "no_lock"), devices=(str(device),))
        assert f"pid {user.pid}" in finding.cause
    finally:
        user.kill()
        user.wait()
    assert lock_findings(str(tmp_path / "no_lock"), devices=(str(device),)) == []


# -- messages of pip, TensorFlow and libtpu --------------------------------------------------------------
@pytest.mark.parametrize("text, cause, fix", [
    ("NotFoundError: No OpKernel was registered to support Op 'ConfigureDistributedTPU' used by {{node "
     "ConfigureDistributedTPU}} with these attrs: [...]\nRegistered devices: [CPU]", "not the TPU build",
     "run_tpu_pretrain"),
    ("Aborted: The TPU is already in use by process with pid 4242. Not attempting to load libtpu.so in this process.",
     "held by process 4242", "kill 4242"),
    ("ConfigureDistributedTpuOp_DoWork not available in this library.", "not the one this TensorFlow was built",
     "libtpu==0.0.10"),
    ("Cannot connect to TPU backend due to usage limits.", "quota", "try again later"),
    ("NotFoundError: could not find registered transfer manager for platform Host -- check target linkage",
     "no XLA backend for the CPU", "--jit_compile off"),
    ("ERROR: No matching distribution found for tensorflow-tpu==2.19.1", "no tensorflow-tpu wheel for this Python",
     "Python 3.12"),
])
def test_error_messages_name_cause_and_fix(text, cause, fix):
    finding, = error_findings(text, LOCAL)
    assert cause in finding.cause and fix in finding.fix


def test_no_internet_on_kaggle_needs_a_phone_verified_account():
    pip = ("WARNING: Retrying (Retry(total=4)) after connection broken by 'NewConnectionError(': Failed to establish a "
           "new connection: [Errno -3] Temporary failure in name resolution')': /simple/tensorflow-tpu/")
    kaggle, = error_findings(pip, KAGGLE)
    assert "no Internet" in kaggle.cause and "Internet: on" in kaggle.fix and "phone-verified" in kaggle.fix
    assert "phone" not in error_findings(pip, COLAB)[0].fix


def test_no_tpu_attached_says_how_to_get_one_and_what_quota_or_stock_out_means():
    assert "Change runtime type > TPU" in no_tpu_finding(COLAB).fix and "stock-out" in no_tpu_finding(COLAB).fix
    assert "TPU VM v5e-8" in no_tpu_finding(KAGGLE).fix and "20 TPU hours" in no_tpu_finding(KAGGLE).fix
    assert "--accelerator auto" in no_tpu_finding(LOCAL).fix


# -- the side environment's code ---------------------------------------------------------------------------
def test_the_package_installs_itself_from_its_checkout_and_finds_an_interpreter():
    assert tpu_env.package_requirement(["test"]) == ["-e", f"{ROOT}[test]"]
    first, second = tpu_env.install_commands("/venv/bin/python", ["-e", str(ROOT)])
    assert first[-4:] == ["-r", str(TPU_SET), "-e", str(ROOT)] and "--no-deps" not in first
    assert "--no-deps" in second and str(TPU_SET.parent / "tpu_no_deps.txt") in second
    assert tpu_env.python_version("/no/such/python") is None
    found = tpu_env.find_python()
    if found is not None:
        assert tpu_env.python_version(found) in ((3, 12), (3, 11), (3, 10))


def test_stream_passes_lines_on_and_stops_a_command_at_its_timeout():
    lines = []
    status, tail = child_process.stream([sys.executable, "-c", "print('one'); print('two'); raise SystemExit(3)"],
                                  echo=lines.append)
    assert status == 3 and lines == ["one\n", "two\n"] and tail == "one\ntwo\n"
    status, _ = child_process.stream([sys.executable, "-c", "import time; time.sleep(60)"], echo=lines.append,
                                     timeout=1)
    assert status == -signal.SIGKILL


def test_a_command_runs_in_an_environment_streamed_and_without_the_callers_paths(monkeypatch, capsys):
    monkeypatch.setenv("TPU_LIBRARY_PATH", "/usr/local/lib/python3.13/dist-packages/libtpu/libtpu.so")  # JAX's
    monkeypatch.setenv("PYTHONPATH", "/usr/local/lib/python3.13/dist-packages")
    here = tpu_env.TpuEnvironment(Path(sys.prefix))  # this environment stands in for the TPU one
    env = tpu_env.child_environment(here.path)
    assert "TPU_LIBRARY_PATH" not in env and "PYTHONPATH" not in env
    assert env["PATH"].startswith(str(here.path / "bin")) and env["VIRTUAL_ENV"] == str(here.path)
    assert here.run(["tpu-check"]) == 1
    out = capsys.readouterr().out
    assert "TPU check FAILED: No TPU is attached" in out and "ended with status" not in out  # explained once


def test_a_folder_that_is_not_an_environment_is_never_touched(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(tpu_env.TpuEnvironmentError, match="is not a Python environment"):
        tpu_env.prepare_tpu_environment(tmp_path, python=sys.executable, echo=lambda line: None)
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.skipif(not TPU_BUILD, reason="only in the TPU environment (make test-tpu-stack)")
def test_this_tpu_environment_is_the_pinned_set_and_resolves_without_another_tensorflow(tmp_path):
    report = inspect_stack()
    assert stack_findings(report) == [] and report.owners == [f"tensorflow-tpu=={tpu_pins()['tensorflow-tpu']}"]
    assert {k: report.versions[k] for k in ("tensorflow-tpu", "libtpu", "tf-keras")} == tpu_pins()
    assert os.environ.get("TPU_LOAD_LIBRARY") == "0"  # set by `import tpu_pretrain` off a TPU VM
    out = tmp_path / "report.json"
    command = tpu_env.install_commands(sys.executable, tpu_env.package_requirement(["test"]))[0]
    done = subprocess.run([*command, "--quiet", "--dry-run", "--ignore-installed", "--report", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    resolved = {normalize(item["metadata"]["name"]): item["metadata"]["version"]
                for item in json.loads(out.read_text())["install"]}
    assert resolved["tensorflow-tpu"] == tpu_pins()["tensorflow-tpu"] and resolved["libtpu"] == tpu_pins()["libtpu"]
    assert report_offenders(json.loads(out.read_text())) == []


# -- tpu-check for real ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_tpu_check_runs_its_steps_and_checkpoint_on_the_cpu_and_says_no_tpu_otherwise():
    status, out = tpu_check("--cpu")
    verdict = out.strip().splitlines()[-1]
    assert status == 0, out[-3000:]
    assert verdict.startswith("TPU check: no TPU here; the probe's steps passed on the CPU (2 replica(s))")
    assert "checkpoint saved and restored" in verdict and "restored identical at step 2" in out
    status, out = tpu_check()
    assert status == 1 and "TPU check FAILED: No TPU is attached to this machine" in out
