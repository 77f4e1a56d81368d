"""The TPU build's own environment: a Python 3.12 virtual environment holding the pinned TPU set, checked, with
``tpu-pretrain`` run in it as a subprocess whose output streams into the caller's cell or terminal.

Why a side environment: tensorflow-tpu has no wheel for Colab's Python 3.13; Kaggle's image holds tensorflow-cpu
and a libtpu of its own (for JAX) in the folders the TPU build would overwrite; and a notebook kernel that imported
TensorFlow holds the TPU until it restarts. So on a TPU runtime the kernel never imports TensorFlow: it builds
this environment (about 70 s and 2 GB, once per session) and runs training there. ``make test-tpu-stack`` builds
it through the same function, from the same requirement files.

The interpreter: an existing Python with a tensorflow-tpu wheel (3.12 first: this one, ``python3.12`` on PATH,
pyenv's), else one that ``uv`` downloads (it is installed with pip when needed).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from ...child_process import stream
from ...environment import environment_override
from ...errors import UserInputError
from ...pinned_sets import NO_DEPS, TPU_NO_DEPS, TPU_SET
from .tpu_diagnosis import diagnose, error_findings, explain, python_findings, stack_findings
from .tpu_stack import TPU_PYTHONS, StackReport, inspect_stack, report_offenders

STAMP = ".tpu-pretrain-stack"  # in the environment: what it was built from (a hash), written when complete
# Variables of the calling process that must not reach the TPU environment: another environment's paths, and the
# libtpu that another environment (JAX's, in Colab's and Kaggle's kernels) announced. tpu_pretrain sets its own.
NOT_INHERITED = ("PYTHONPATH", "PYTHONHOME", "TPU_LIBRARY_PATH", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH")


class TpuEnvironmentError(UserInputError):
    """The TPU environment cannot be made or is not sound; the message names the cause and the fix."""


def default_location() -> Path:
    cache = environment_override("TPU_PRETRAIN_CACHE_DIR", str(Path.home() / ".cache" / "tpu_pretrain"))
    return Path(cache) / "tpu-venv"


def python_version(python: str) -> tuple[int, int] | None:
    """The (major, minor) of an interpreter, or None when it does not run (a pyenv shim without that version)."""
    try:
        done = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = done.stdout.split()
    return (int(parts[0]), int(parts[1])) if done.returncode == 0 and len(parts) == 2 else None


def find_python() -> str | None:
    """An existing interpreter that has a tensorflow-tpu wheel, the preferred version first."""
    pyenv = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    for major, minor in TPU_PYTHONS:
        name = f"python{major}.{minor}"
        candidates = [sys.executable, shutil.which(name)]
        installed = glob.glob(os.path.join(pyenv, "versions", f"{major}.{minor}.*", "bin", name))
        candidates += sorted(installed, reverse=True)
        for candidate in filter(None, candidates):
            if python_version(candidate) == (major, minor):
                return candidate
    return None


def package_requirement(extras: Sequence[str] = ()) -> list[str]:
    """pip arguments that install this same tpu_pretrain (its checkout, commit, file or release) elsewhere."""
    suffix = f"[{','.join(extras)}]" if extras else ""
    checkout = Path(__file__).resolve().parents[3]
    if (checkout / "setup.cfg").is_file():
        return ["-e", f"{checkout}{suffix}"]  # running from a source tree (an editable install, or PYTHONPATH)
    try:
        distribution = metadata.distribution("tpu_pretrain")
    except metadata.PackageNotFoundError:
        return [f"tpu_pretrain{suffix}"]
    origin = json.loads(distribution.read_text("direct_url.json") or "null")
    if origin is None:
        return [f"tpu_pretrain{suffix}=={distribution.version}"]
    if "vcs_info" in origin:
        vcs = origin["vcs_info"]
        revision = vcs.get("commit_id") or vcs.get("requested_revision")
        return [f"tpu_pretrain{suffix} @ {vcs['vcs']}+{origin['url']}" + (f"@{revision}" if revision else "")]
    return [f"tpu_pretrain{suffix} @ {origin['url']}"]


def install_commands(python: str | os.PathLike, package: Sequence[str]) -> list[list[str]]:
    """The two pip runs: the TPU set with the package and its dependencies, then the no-deps pins."""
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off"]
    return [pip + ["-r", str(TPU_SET), *package], pip + ["--no-deps", "-r", str(TPU_NO_DEPS), "-r", str(NO_DEPS)]]


def child_environment(venv: Path) -> dict[str, str]:
    """The process environment for the TPU environment's programs (its bin first; see NOT_INHERITED)."""
    env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", PYTHONUNBUFFERED="1")
    return env


@dataclass
class TpuEnvironment:
    """A built TPU environment: its interpreter, what it holds, and ``tpu-pretrain`` run inside it."""

    path: Path

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def site_packages(self) -> list[str]:
        return sorted(glob.glob(str(self.path / "lib" / "python3*" / "site-packages")))

    def inspect(self, hashes: bool = True) -> StackReport:
        version = self.site_packages()[0].split(os.sep)[-2].removeprefix("python") if self.site_packages() else "?"
        return inspect_stack(self.site_packages(), python=version, hashes=hashes)

    def command(self, args: Sequence[str]) -> list[str]:
        return [str(self.python), "-m", "tpu_pretrain", *args]

    def run(self, args: Sequence[str], echo: Callable[[str], None] | None = None) -> int:
        """``tpu-pretrain ARGS`` in this environment, streamed; on failure the diagnosis follows the output."""
        status, tail = stream(self.command(args), env=child_environment(self.path), echo=echo)
        if status not in (0, 2) and "\n  fix: " not in tail:  # 2, or a fix printed: the command explained it
            findings = diagnose(tail, report=self.inspect(hashes=False))
            print(f"tpu-pretrain {' '.join(args[:1])} ended with status {status}."
                  + (f" Diagnosis:\n{explain(findings)}" if findings else ""), flush=True)
        return status


def _fingerprint(package: Sequence[str]) -> str:
    """What the environment is built from: the pinned files, the package's source and its dependencies."""
    parts = [path.read_text() for path in (TPU_SET, TPU_NO_DEPS, NO_DEPS)] + list(package)
    local = [Path(arg.split("[")[0]) for arg in package if Path(arg.split("[")[0]).is_dir()]
    parts += [(path / "setup.cfg").read_text() for path in local if (path / "setup.cfg").is_file()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _run_step(command: Sequence[str], what: str, env: dict[str, str] | None = None) -> None:
    status, tail = stream(command, env=env, echo=lambda line: None)
    if status:
        findings = error_findings(tail)
        raise TpuEnvironmentError(f"{what} failed (status {status}):\n{tail[-3000:]}\n"
                                  + (explain(findings) if findings else f"command: {' '.join(command)}"))


def create_venv(venv: Path, python: str | None) -> None:
    """A virtual environment from ``python``, or from a Python 3.12 that uv provides (downloading it if needed)."""
    if python:
        existed = venv.exists()
        done = subprocess.run([python, "-m", "venv", str(venv)], capture_output=True, text=True)
        if done.returncode == 0:
            return
        if not existed:  # half made just now (some system Pythons lack ensurepip): uv seeds pip instead
            shutil.rmtree(venv, ignore_errors=True)
    try:
        _run_step([sys.executable, "-m", "pip", "install", "--quiet", "uv"], "Installing uv (it provides Python 3.12)")
        _run_step([sys.executable, "-m", "uv", "venv", "--seed", "--python", python or "3.12", str(venv)],
                  "Making a Python 3.12 environment with uv")
    except TpuEnvironmentError as exc:  # say what to choose instead (Colab: a runtime version with Python 3.12)
        advice = explain(python_findings(sys.version_info[:2]))
        raise TpuEnvironmentError(f"{exc}\n{advice}".strip()) from None


def check_dry_run(command: Sequence[str], env: dict[str, str] | None = None) -> None:
    """Refuse before installing if pip's resolution of ``command`` holds a non-TPU TensorFlow build."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        _run_step([*command, "--quiet", "--dry-run", "--ignore-installed", "--report", str(report)],
                  "Resolving the TPU set (pip install --dry-run)", env)
        offenders = report_offenders(json.loads(report.read_text()))
    if offenders:
        raise TpuEnvironmentError(f"pip would install {', '.join(offenders)} beside tensorflow-tpu, overwriting the "
                                  f"TPU build; the requirement files in {TPU_SET.parent} must keep TensorFlow out "
                                  "of the package's dependencies.")


def build(venv: Path, python: str | None, package: Sequence[str], echo: Callable[[str], None]) -> None:
    """Make the environment and install the pinned set (each resolution checked first); stamp it when done."""
    if venv.exists() and not (venv / "pyvenv.cfg").is_file():
        raise TpuEnvironmentError(f"{venv} exists and is not a Python environment; choose another folder.")
    (venv / STAMP).unlink(missing_ok=True)
    if not (venv / "bin" / "python").exists():
        echo(f"Making the TPU environment in {venv} with {python or 'a Python 3.12 from uv'}")
        create_venv(venv, python)
    python_here, env = str(venv / "bin" / "python"), child_environment(venv)  # not the caller's PYTHONPATH
    _run_step([python_here, "-m", "pip", "install", "--quiet", "--upgrade", "pip"], "Upgrading pip", env)
    commands = install_commands(python_here, package)
    for command in commands:
        check_dry_run(command, env)
    echo("Installing the TPU set (tensorflow-tpu, libtpu, tpu_pretrain and its dependencies; about a minute, 2 GB)")
    for command in commands:
        _run_step([*command, "--quiet"], "Installing the TPU set", env)
    (venv / STAMP).write_text(_fingerprint(package) + "\n")


def prepare_tpu_environment(venv: str | os.PathLike | None = None, *, python: str | None = None,
                            extras: Sequence[str] = (), package: Sequence[str] | None = None, rebuild: bool = False,
                            echo: Callable[[str], None] = print) -> TpuEnvironment:
    """The TPU environment at ``venv`` (default ~/.cache/tpu_pretrain/tpu-venv), built if needed, and checked.

    ``package`` is how pip installs tpu_pretrain there (default: the same checkout, commit or release as this
    one, with ``extras``); ``python`` an interpreter to build it from (default: :func:`find_python`, else uv).
    A complete environment built from the same files is reused; ``rebuild`` makes it again.
    """
    venv = Path(venv or default_location()).absolute()
    package = list(package or package_requirement(extras))
    stamp = venv / STAMP
    if rebuild and stamp.is_file():
        shutil.rmtree(venv)  # only an environment this module built and stamped
    if not stamp.is_file() or stamp.read_text().strip() != _fingerprint(package):
        chosen = python or find_python()
        build(venv, chosen, package, echo)
    environment = TpuEnvironment(venv)
    report = environment.inspect()
    version = tuple(int(p) for p in report.python.split(".")) if report.python[:1].isdigit() else (0, 0)
    problems = python_findings(version) + stack_findings(report)
    if problems:
        raise TpuEnvironmentError(f"The TPU environment {venv} is not sound:\n{explain(problems)}")
    v = report.versions
    echo(f"TPU environment ready: {venv} (Python {report.python}, tensorflow-tpu {v['tensorflow-tpu']}, libtpu "
         f"{v.get('libtpu')}, tf-keras {v.get('tf-keras')}; {report.record.checked} files of the TPU build match the "
         f"hashes its wheel recorded; no other TensorFlow build)")
    return environment


def run_tpu_pretrain(args: Sequence[str], venv: str | os.PathLike | None = None, **options) -> int:
    """``tpu-pretrain ARGS`` (``train ...``, ``tpu-check``) in the TPU environment, built first if needed.

    What the notebooks call on a TPU runtime; the output streams into the cell. Returns the exit status.
    """
    return prepare_tpu_environment(venv, **options).run(args)
