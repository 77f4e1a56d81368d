"""The TensorFlow a TPU needs, as pinned sets, and what an installed environment actually holds.

The pinned sets are the package's own requirement files (named by :mod:`tpu_pretrain.pinned_sets`). The checks
read distributions' metadata and RECORD files and never import TensorFlow: they run in a notebook kernel that
must not load it on a TPU runtime, and against any environment's site-packages.

Why RECORD hashes and not only names: ``tensorflow``, ``tensorflow-cpu`` and ``tensorflow-tpu`` all install
into one ``tensorflow/`` folder, so the last wheel installed wins file by file (``_xla_ops.so``,
``libtensorflow_cc.so.2``, ...), and uninstalling the intruder afterwards deletes files the TPU build needs.
Only comparing the files with the sha256 each wheel recorded shows that.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import re
import sys
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

from ...pinned_sets import TPU_NO_DEPS, TPU_SET, normalize, pins

# Pythons with a wheel of the pinned tensorflow-tpu (none for 3.13), the preferred first.
TPU_PYTHONS = ((3, 12), (3, 11), (3, 10))

# tensorflow-tpu release -> the libtpu its wheel requires (Requires-Dist of each wheel's METADATA, November 2026).
# An explicit map: libtpu's versions do not follow TensorFlow's (2.19.1 needs libtpu 0.0.10).
LIBTPU_FOR_TENSORFLOW_TPU = {
    "2.16.1": "2.16.0rc0", "2.16.2": "2.16.0rc0", "2.17.0": "2.17.0", "2.17.1": "2.17.1", "2.18.0": "2.18.0",
    "2.19.1": "0.0.10",
}
# Releases that cannot serve the free TPUs, and why.
UNUSABLE_TENSORFLOW_TPU = {
    "2.20.0": "it accepts any libtpu 0.0.x and pip picks the newest, with which importing TensorFlow aborts "
              "(ConfigureDistributedTpuOp_DoWork not available in this library)",
}
# Distributions that write the same tensorflow/ folder as tensorflow-tpu.
OTHER_BUILDS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tensorflow-macos",
                "tf-nightly", "tf-nightly-cpu")


def tpu_pins() -> dict[str, str]:
    """The pinned TPU set: tensorflow-tpu, libtpu and the tf-keras installed beside them."""
    return {**pins(TPU_SET), **pins(TPU_NO_DEPS)}


@dataclass
class RecordCheck:
    """Files of a distribution that no longer match its RECORD (another wheel wrote them, or removed them)."""

    checked: int = 0
    modified: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.modified and not self.missing


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()


def record_check(distribution: metadata.Distribution, prefix: str = "tensorflow/", hashes: bool = True) -> RecordCheck:
    """Compare the files under ``prefix`` with the sizes (and sha256, unless ``hashes`` is False) in RECORD."""
    result = RecordCheck()
    root = Path(distribution.locate_file(""))
    for row in csv.reader((distribution.read_text("RECORD") or "").splitlines()):
        if len(row) < 3 or not row[1] or not row[0].startswith(prefix):
            continue  # RECORD itself and byte-code files carry no hash
        relative, (algorithm, _, expected), size = row[0], row[1].partition("="), row[2]
        path = root / relative
        if not path.is_file():
            result.missing.append(relative)
        elif size and path.stat().st_size != int(size):
            result.modified.append(relative)
        elif hashes and algorithm == "sha256" and _sha256(path) != expected:
            result.modified.append(relative)
        result.checked += 1
    return result


@dataclass
class StackReport:
    """What an environment holds of the TPU stack, read without importing TensorFlow."""

    python: str  # "3.12"
    versions: dict[str, str]  # installed version of each distribution that matters, by normalised name
    owners: list[str] = field(default_factory=list)  # distributions whose RECORD lists tensorflow/__init__.py
    record: RecordCheck | None = None  # tensorflow-tpu's files against its RECORD
    location: str = ""

    @property
    def tensorflow_tpu(self) -> str | None:
        return self.versions.get("tensorflow-tpu")

    @property
    def libtpu(self) -> str | None:
        return self.versions.get("libtpu")

    @property
    def other_builds(self) -> dict[str, str]:
        return {name: self.versions[name] for name in OTHER_BUILDS if name in self.versions}

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> StackReport:
        record = data.get("record")
        return cls(**{**data, "record": RecordCheck(**record) if record else None})


def inspect_stack(site_packages: list[str] | None = None, python: str | None = None,
                  hashes: bool = True) -> StackReport:
    """The TPU stack in these site-packages folders (default: this interpreter's), RECORD-checked."""
    wanted = set(OTHER_BUILDS) | {"tensorflow-tpu", "libtpu", "tf-keras", "bert4keras", "keras", "protobuf"}
    found = {}
    owners = []
    paths = site_packages if site_packages is not None else sys.path
    for distribution in metadata.distributions(path=paths):
        name = normalize(distribution.metadata["Name"] or "")
        if name in wanted and name not in found:
            found[name] = distribution
        if name in set(OTHER_BUILDS) | {"tensorflow-tpu"}:
            record = distribution.read_text("RECORD") or ""
            if re.search(r"^tensorflow/__init__\.py,", record, re.MULTILINE):
                owners.append(f"{name}=={distribution.version}")
    record = record_check(found["tensorflow-tpu"], hashes=hashes) if "tensorflow-tpu" in found else None
    location = str(found["tensorflow-tpu"].locate_file("")) if "tensorflow-tpu" in found else ""
    return StackReport(python=python or f"{sys.version_info.major}.{sys.version_info.minor}",
                       versions={name: d.version for name, d in sorted(found.items())}, owners=sorted(owners),
                       record=record, location=location)


def report_offenders(report: dict) -> list[str]:
    """Non-TPU TensorFlow builds that a ``pip install --dry-run --report`` would install (``name==version``)."""
    return [f"{item['metadata']['name']}=={item['metadata']['version']}" for item in report.get("install", [])
            if normalize(item["metadata"]["name"]) in OTHER_BUILDS]
