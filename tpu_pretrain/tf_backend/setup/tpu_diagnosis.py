"""Why TensorFlow cannot use the TPU, and what to do: a cause and a fix for each failure seen in the wild.

Each check takes the facts it reads as arguments (an environment's :class:`.tpu_stack.StackReport`, the
variables TensorFlow was imported with, the lock file and ``/proc``, an error's text, the runtime), so tests
can fake them; :func:`diagnose` gathers the real ones. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ...environment import PJRT_VARIABLES
from ...runtime import COLAB, KAGGLE, runtime, tpu_vm_present
from .tpu_stack import (
    LIBTPU_FOR_TENSORFLOW_TPU,
    TPU_PYTHONS,
    UNUSABLE_TENSORFLOW_TPU,
    StackReport,
    inspect_stack,
    tpu_pins,
)

LOCK_FILE = "/tmp/libtpu_lockfile"  # libtpu's one-process-per-TPU lock (a POSIX lock, held until the process ends)
TPU_DEVICES = ("/dev/accel*", "/dev/vfio/[0-9]*")
TPU_ENVIRONMENT = ("train through the TPU environment: "
                   "tpu_pretrain.tf_backend.setup.tpu_env.run_tpu_pretrain(['train', ...]) builds it (Python 3.12, "
                   "the pinned set, checked) and runs `tpu-pretrain` there")
REINSTALL = ("pip uninstall -y {intruder} && pip install --force-reinstall --no-deps tensorflow-tpu=={tpu}, or "
             "rebuild the TPU environment (tpu-pretrain tpu-env --rebuild).")


@dataclass(frozen=True)
class Finding:
    """One cause of a TPU failure and the fix for it."""

    cause: str
    fix: str

    def text(self) -> str:
        return f"{self.cause}\n  fix: {self.fix}"


def explain(findings: Iterable[Finding]) -> str:
    return "\n".join(f.text() for f in findings)


def python_findings(python: tuple[int, int]) -> list[Finding]:
    """The Python has no wheel of the pinned tensorflow-tpu."""
    if python in TPU_PYTHONS:
        return []
    version = ".".join(map(str, python))
    supported = ", ".join(".".join(map(str, p)) for p in sorted(TPU_PYTHONS))
    age = "too new" if python > max(TPU_PYTHONS) else "too old"
    return [Finding(
        f"Python {version} is {age} for TensorFlow on TPUs: tensorflow-tpu {tpu_pins()['tensorflow-tpu']} (the last "
        f"release that runs on TPUs) has wheels for Python {supported} only.",
        "tpu_pretrain.tf_backend.setup.tpu_env makes a Python 3.12 environment for it (an existing python3.12, else "
        "one that uv downloads); if that cannot be made, on Colab choose Runtime > Change runtime type > Runtime "
        "version with Python 3.12.")]


def stack_findings(report: StackReport) -> list[Finding]:
    """What is wrong with an environment's TPU build: missing, another build beside it, files, libtpu, tf-keras."""
    pinned = tpu_pins()
    tpu = report.tensorflow_tpu
    if not tpu:
        builds = ", ".join(f"{n} {v}" for n, v in report.other_builds.items()) or "no TensorFlow"
        return [Finding(f"tensorflow-tpu is not installed in this environment ({builds}): no other TensorFlow build "
                        "can see a TPU.", TPU_ENVIRONMENT + ".")]
    found = []
    if tpu in UNUSABLE_TENSORFLOW_TPU:
        found.append(Finding(f"tensorflow-tpu {tpu} cannot run on the free TPUs: {UNUSABLE_TENSORFLOW_TPU[tpu]}.",
                             f"use the pinned tensorflow-tpu=={pinned['tensorflow-tpu']}: " + TPU_ENVIRONMENT + "."))
    for name, version in report.other_builds.items():
        found.append(Finding(
            f"{name} {version} is installed beside tensorflow-tpu {tpu}: both install into the same tensorflow/ "
            "folder, so files of the TPU build were overwritten (tf-keras installed with its dependencies does this).",
            REINSTALL.format(intruder=name, tpu=tpu)))
    record = report.record
    if record is not None and not record.ok:
        files = record.modified + record.missing
        sample = ", ".join(sorted(files, key=lambda f: not f.endswith(".so"))[:3])
        found.append(Finding(
            f"{len(record.modified)} file(s) of tensorflow-tpu {tpu} differ from the hashes its wheel recorded and "
            f"{len(record.missing)} are missing (for example {sample}): another TensorFlow wheel was written over it, "
            "or removed with files the TPU build needs.",
            REINSTALL.format(intruder=" ".join(report.other_builds) or "tensorflow", tpu=tpu)))
    found += _libtpu_findings(tpu, report.libtpu)
    keras = report.versions.get("tf-keras")
    if keras and keras.split(".")[:2] != tpu.split(".")[:2]:
        found.append(Finding(f"tf-keras {keras} does not match tensorflow-tpu {tpu} (they share a minor version).",
                             f"pip install --no-deps tf-keras=={pinned['tf-keras']} (--no-deps: its dependency on "
                             "`tensorflow` would overwrite the TPU build)."))
    return found


def _libtpu_findings(tpu: str, libtpu: str | None) -> list[Finding]:
    needed = LIBTPU_FOR_TENSORFLOW_TPU.get(tpu)
    if needed is None:
        if tpu in UNUSABLE_TENSORFLOW_TPU:
            return []
        known = ", ".join(f"{t} -> {v}" for t, v in LIBTPU_FOR_TENSORFLOW_TPU.items())
        return [Finding(f"tensorflow-tpu {tpu} is not a release whose libtpu is known here (known: {known}).",
                        f"use the pinned tensorflow-tpu=={tpu_pins()['tensorflow-tpu']}: " + TPU_ENVIRONMENT + ".")]
    if libtpu == needed:
        return []
    found = f"libtpu {libtpu} is installed" if libtpu else "libtpu is not installed"
    return [Finding(f"{found}, but tensorflow-tpu {tpu} needs libtpu {needed} (a libtpu of another release lacks "
                    "the functions it calls: 'ConfigureDistributedTpuOp_DoWork not available in this library').",
                    f"pip install libtpu=={needed}" + ("" if needed.startswith("0.") else
                                                         " (not on PyPI: add -f https://storage.googleapis.com/"
                                                         "libtpu-tf-releases/index.html)"))]


def pjrt_findings(at_import: Mapping[str, str | None]) -> list[Finding]:
    """On a TPU VM: TensorFlow was imported without the PJRT variables a TPU v5e needs."""
    missing = [name for name in PJRT_VARIABLES if not at_import.get(name)]
    wrong = []
    if at_import.get("PJRT_DEVICE") and at_import["PJRT_DEVICE"] != "TPU":
        wrong.append(f"PJRT_DEVICE={at_import['PJRT_DEVICE']}")
    library = at_import.get("TF_PLUGGABLE_DEVICE_LIBRARY_PATH")
    if library and not os.path.isfile(library):
        wrong.append(f"TF_PLUGGABLE_DEVICE_LIBRARY_PATH={library} (no such file)")
    if not missing and not wrong:
        return []
    problem = "; ".join(filter(None, [f"missing {', '.join(missing)}" if missing else "", ", ".join(wrong)]))
    return [Finding(f"TensorFlow was imported without the PJRT variables a TPU v5e needs ({problem}): it then "
                    "crashes or reports 'No TPU platform registered'.",
                    "import tpu_pretrain before TensorFlow in a fresh process (it sets them on a TPU VM): restart the "
                    "kernel, or " + TPU_ENVIRONMENT + ".")]


def lock_holders(lock_file: str = LOCK_FILE, proc: str = "/proc") -> list[int]:
    """The processes holding a POSIX lock on ``lock_file`` (read from /proc/locks)."""
    try:
        stat = os.stat(lock_file)
        lines = Path(proc, "locks").read_text().splitlines()
    except OSError:
        return []
    device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    holders = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[1] != "->" and fields[5] == device:
            holders.append(int(fields[4]))
    return holders


def device_users(devices: Iterable[str] = TPU_DEVICES, proc: str = "/proc") -> list[int]:
    """Processes with a TPU device file open (what libtpu itself looks for)."""
    paths = {os.path.realpath(p) for pattern in devices for p in glob.glob(pattern)}
    users = []
    for fd_dir in glob.glob(os.path.join(proc, "[0-9]*", "fd")):
        try:
            if any(os.path.realpath(os.path.join(fd_dir, fd)) in paths for fd in os.listdir(fd_dir)):
                users.append(int(Path(fd_dir).parent.name))
        except OSError:
            continue  # another user's process, or one that just ended
    return sorted(users)


def process_command(pid: int, proc: str = "/proc") -> str:
    try:
        return Path(proc, str(pid), "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "command line unreadable"


def lock_findings(lock_file: str = LOCK_FILE, devices: Iterable[str] = TPU_DEVICES, proc: str = "/proc",
                  own: Iterable[int] = (), error_text: str = "") -> list[Finding]:
    """The TPU held by another process (its pid), or a lock file that no process holds any more.

    A lock file left by a killed process stops libtpu only when it belongs to another user, or when the
    error says libtpu could not take it; otherwise libtpu takes it over, and it is not named.
    """
    own = set(own) | {os.getpid()}
    holders = sorted(set(lock_holders(lock_file, proc)) | set(device_users(devices, proc)) - own)
    if holders:
        named = "; ".join(f"pid {pid} ({process_command(pid, proc)[:120]})" for pid in holders)
        return [Finding(f"The TPU is held by another process: {named}. Only one process can use a TPU, and a "
                        "notebook kernel that imported TensorFlow holds it until it ends.",
                        f"end it (kill {' '.join(map(str, holders))}; for a notebook kernel: restart it, on Colab "
                        "Runtime > Restart session), then run again. Keep TensorFlow out of the kernel: "
                        + TPU_ENVIRONMENT + ".")]
    if not os.path.exists(lock_file):
        return []
    if not os.access(lock_file, os.R_OK | os.W_OK):
        return [Finding(f"{lock_file} belongs to another user and no process holds it: libtpu cannot open it.",
                        f"sudo rm {lock_file}")]
    if re.search(r"libtpu multi-process lockfile|libtpu_lockfile", error_text):
        return [Finding(f"{lock_file} is stale: no process holds it (the process that made it was killed).",
                        f"rm {lock_file}")]
    return []


# (pattern, cause, fix) for messages of pip, TensorFlow and libtpu; {0} is the pattern's first group.
MESSAGES = (
    (r"No OpKernel was registered to support Op 'ConfigureDistributedTPU'",
     "The TensorFlow that was loaded is not the TPU build (its kernels are registered for the CPU only): tensorflow "
     "or tensorflow-cpu is installed over or instead of tensorflow-tpu.", TPU_ENVIRONMENT + "."),
    (r"The TPU is already in use by process with pid (\d+)",
     "The TPU is held by process {0}: only one process can use a TPU.",
     "end it (kill {0}; if it is a notebook kernel that imported TensorFlow, restart that kernel), then run again."),
    (r"already in use by another process probably owned by another user",
     f"libtpu could not open {LOCK_FILE}: another user's process holds the TPU, or left the file.",
     f"check with `sudo lsof -w /dev/accel0`; if no process uses the TPU: sudo rm {LOCK_FILE}"),
    (r"ConfigureDistributedTpuOp_DoWork not available|libtpu\.so: undefined symbol",
     "The libtpu that was loaded is not the one this TensorFlow was built against.",
     f"pip install libtpu=={tpu_pins()['libtpu']} (with tensorflow-tpu=={tpu_pins()['tensorflow-tpu']}); if "
     "another environment's libtpu was loaded, unset TPU_LIBRARY_PATH."),
    (r"No TPU platform registered|Could not find any TPU devices",
     "TensorFlow found no TPU platform: the PJRT variables were missing when it was imported, TPU_LOAD_LIBRARY=0 "
     "was set, or no TPU is attached.",
     "import tpu_pretrain before TensorFlow in a fresh process (it sets the variables on a TPU VM), and unset "
     "TPU_LOAD_LIBRARY there."),
    (r"usage limits|[Qq]uota[^\n]*(exceeded|exhausted)|RESOURCE_EXHAUSTED[^\n]*[Qq]uota|[Ss]tock-?out|no more "
     r"capacity",
     "No TPU could be had: the account's TPU quota is used up, or none is free (stock-out).",
     "try again later (Colab's limits ease after some hours; Kaggle gives 20 TPU hours a week); meanwhile train on a "
     "GPU or CPU runtime: the run resumes from its checkpoints on the TPU later."),
    (r"could not find registered transfer manager for platform Host",
     "This TensorFlow (the TPU build) has no XLA backend for the CPU, and XLA was asked for on the CPU.",
     "--jit_compile off when training on the CPU with it (on the TPU, XLA is always on)."),
    (r"No matching distribution found for tensorflow-tpu|Could not find a version that satisfies the requirement "
     r"tensorflow-tpu",
     "pip found no tensorflow-tpu wheel for this Python.",
     "use a Python 3.10-3.12 environment: tpu_pretrain.tf_backend.setup.tpu_env makes one (Python 3.12)."),
)
NETWORK = r"Temporary failure in name resolution|Failed to establish a new connection|Network is unreachable|" \
          r"NewConnectionError|Name or service not known"


def error_findings(text: str, where: str | None = None) -> list[Finding]:
    """Findings from the text of a failure (pip's, TensorFlow's or libtpu's messages)."""
    found = []
    for pattern, cause, fix in MESSAGES:
        match = re.search(pattern, text)
        if match:
            groups = match.groups() or ("",)
            found.append(Finding(cause.format(*groups), fix.format(*groups)))
    if re.search(NETWORK, text):
        if (where or runtime()) == KAGGLE:
            found.append(Finding("A download failed: this Kaggle notebook has no Internet.",
                                 "in the notebook's side panel, Session options > Internet: on. Kaggle allows it only "
                                 "for a phone-verified account (Settings > Phone verification)."))
        else:
            found.append(Finding("A download failed: no network, or a proxy or firewall in the way.",
                                 "check the connection, then run again."))
    return found


def no_tpu_finding(where: str | None = None) -> Finding:
    """No TPU is attached: how to get one on this platform, and what a missing one after asking means."""
    where = where or runtime()
    if where == COLAB:
        return Finding("No TPU is attached to this Colab runtime.",
                       "Runtime > Change runtime type > TPU (v5e-1), then run again. If TPU was chosen and the session "
                       "still has none, Colab gave none: usage limits (quota) or no free TPU (stock-out); try later, "
                       "and meanwhile train on a GPU: the run resumes on the TPU from its checkpoints.")
    if where == KAGGLE:
        return Finding("No TPU is attached to this Kaggle session.",
                       "Settings > Accelerator > TPU VM v5e-8 (needs a phone-verified account). When the week's 20 "
                       "TPU hours are used up, or all TPUs are taken (a queue), the session has none: wait for the "
                       "weekly reset or the queue; the run resumes from its checkpoints.")
    return Finding("No TPU is attached to this machine (no /dev/accel*, /dev/vfio, or TPU VM variables).",
                   "train with --accelerator auto (GPU or CPU), or on a TPU VM.")


def diagnose(error_text: str = "", *, report: StackReport | None = None, python: tuple[int, int] | None = None,
             at_import: Mapping[str, str | None] | None = None, where: str | None = None) -> list[Finding]:
    """Every cause that applies here, most fundamental first (no TPU, Python, the install, variables, the lock).

    ``report`` describes the environment TensorFlow ran in (default: this one), ``python`` its version.
    """
    found = error_findings(error_text, where)
    if not tpu_vm_present():
        quota = [f for f in found if "quota" in f.cause]
        return [no_tpu_finding(where)] + quota
    report = report or inspect_stack()
    python = python or tuple(int(part) for part in report.python.split(".")[:2])
    found = python_findings(python) + stack_findings(report) + found
    if at_import is not None and report.tensorflow_tpu:
        found += pjrt_findings(at_import)
    found += lock_findings(error_text=error_text)
    unique: dict[str, Finding] = {}
    for finding in found:
        unique.setdefault(finding.cause, finding)
    return list(unique.values())
