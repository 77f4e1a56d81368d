"""The package's pinned requirement files (``tpu_pretrain/requirements/*.txt``) named, and their pins read.

The files ship inside the package, so a notebook can install a pinned set after a plain ``pip install
tpu_pretrain``, and ``setup.cfg``'s extras read the same files: one statement of each version. Their one owner sits at
the bottom of the package because the environment checks (bert4keras's version) and the notebooks' installs read
them as well as the TPU set-up.
"""

from __future__ import annotations

import re
from pathlib import Path

REQUIREMENTS = Path(__file__).parent / "requirements"
CPU_GPU_SET = REQUIREMENTS / "cpu_gpu.txt"  # the standard build: the [cpu]/[gpu] extras
TPU_SET = REQUIREMENTS / "tpu.txt"  # tensorflow-tpu and its libtpu, installed with the package
TPU_NO_DEPS = REQUIREMENTS / "tpu_no_deps.txt"  # tf-keras, whose dependency on `tensorflow` must not be followed
NO_DEPS = REQUIREMENTS / "no_deps.txt"  # bert4keras, everywhere


def normalize(name: str) -> str:
    """A distribution's name as pip compares it (PEP 503): ``tensorflow_cpu`` is ``tensorflow-cpu``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    """``{distribution: version}`` of a requirement file's ``name==version`` lines."""
    found = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s;#]+)", line)
        if match:
            found[normalize(match.group(1))] = match.group(2)
    return found
