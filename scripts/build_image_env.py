"""Build a virtual environment package for package like a free TPU runtime's image, and install the project into it
as a user of that image would (``make test-tpu-images``).

Usage: python scripts/build_image_env.py VENV PINS

PINS is a file of ``name==version`` lines (tests/environments/*.txt) whose ``python==X.Y`` line names the
interpreter: ``pythonX.Y`` on PATH, else one of pyenv's. The image's packages are installed first, then the project
with its own dependencies and the test extra, the image's versions given to the installer as constraints: an image
version the project cannot live with fails here (no solution), not on the user's TPU. Finally every pin is checked
against what is installed. The installer is uv, with pip's index and local wheels (the same versions as pip's, in a
third of the time and CPU that `make test` spends beside the main suite). Stdlib only: it runs before any
environment exists.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def read_pins(path: Path) -> tuple[str, list[str]]:
    """(python version, requirement lines) of a pins file."""
    python, pins = "", []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("python=="):
            python = line.split("==", 1)[1]
        elif line:
            pins.append(line)
    if not python:
        sys.exit(f"{path}: no python==X.Y line")
    return python, pins


def find_interpreter(version: str) -> str:
    """An interpreter of ``version`` that runs: pythonX.Y on PATH, else pyenv's."""
    pyenv = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    candidates = [f"python{version}", *sorted(glob.glob(os.path.join(pyenv, "versions", f"{version}.*", "bin",
                                                                     f"python{version}")), reverse=True)]
    for candidate in candidates:
        try:
            done = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                  capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0 and done.stdout.strip() == version:
            return candidate
    sys.exit(f"No Python {version} here (tried {', '.join(candidates)}): install it (pyenv install {version}).")


def run(*command: str) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def check_installed(python: str, pins: list[str]) -> None:
    """Every pin as installed: a project dependency that moved one fails the build."""
    names = {re.sub(r"\[.*\]", "", p.split("==")[0]): p.split("==")[1] for p in pins}
    script = ("import json, sys; from importlib import metadata; "
              "print(json.dumps({n: metadata.version(n) for n in sys.argv[1:]}))")
    done = subprocess.run([python, "-c", script, *names], capture_output=True, text=True, check=True)
    found = json.loads(done.stdout)
    moved = [f"{name} {found[name]} (the image has {version})" for name, version in names.items()
             if found[name] != version]
    if moved:
        sys.exit("Installing the project moved the image's packages: " + "; ".join(moved))


def main(venv: str, pins_file: str) -> None:
    version, pins = read_pins(Path(pins_file))
    venv_path = Path(venv)
    if not (venv_path / "bin" / "python").exists():
        run(find_interpreter(version), "-m", "venv", str(venv_path))
    python = str(venv_path / "bin" / "python")
    run(python, "-m", "pip", "install", "--quiet", "--upgrade", "pip", "setuptools", "wheel", "uv")
    install = [python, "-m", "uv", "pip", "install", "--quiet", "--python", python,
               *(["--find-links", os.environ["PIP_FIND_LINKS"]] if os.environ.get("PIP_FIND_LINKS") else [])]
    run(*install, *pins)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as constraints:
        constraints.write("\n".join(re.sub(r"\[.*?\]", "", p) for p in pins) + "\n")
    try:
        run(*install, "-c", constraints.name, "-e", f"{REPO}[test]")
    finally:
        os.unlink(constraints.name)
    check_installed(python, pins)
    print(f"{venv}: Python {version} with " + ", ".join(pins) + " (checked after the project's install)")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
