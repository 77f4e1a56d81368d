"""Where a notebook reads and writes: durable places that outlive the runtime, and its own scratch space.

A free runtime loses its disk when the session ends, and each notebook may run on a machine of its own. So
every notebook reads its inputs from, and writes its results to, a durable place: a Google Drive folder
(Colab), a Cloud Storage bucket, or Kaggle's notebook output (``/kaggle/working``, saved with the
notebook's version, which a later notebook attaches as an input under ``/kaggle/input``). Work in progress
(a local copy of the shards, the run being trained) lives on the runtime's fast local disk and is mirrored
to the durable place. A project's durable folder holds ``data/`` (01's shards), ``runs/<name>/`` (the
mirrored runs) and ``exports/<name>/``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from .. import storage
from ..core.run_folder import CONFIG, RunFolder, config_file_at
from ..errors import UserInputError
from ..runtime import COLAB, KAGGLE, runtime
from ..storage import drive

DRIVE_PROJECT = "/content/drive/MyDrive/tpu_pretrain"
KAGGLE_WORKING = "/kaggle/working"
KAGGLE_INPUT = "/kaggle/input"


def default_project_dir() -> str:
    """Drive on Colab, the notebook's output on Kaggle, ``./tpu_pretrain`` elsewhere."""
    return {COLAB: DRIVE_PROJECT, KAGGLE: f"{KAGGLE_WORKING}/tpu_pretrain"}.get(runtime(), "tpu_pretrain")


def project_dir(params) -> str:
    return params.get("project_dir") or default_project_dir()


def is_remote(path: str) -> bool:
    """A place to mirror to rather than work in: a bucket, or Drive (slow, and counted against a quota)."""
    return storage.is_gcs_url(path) or drive.is_drive_path(path)


def work_dir() -> Path:
    """Scratch space on the runtime's local disk (on Kaggle outside /kaggle/working, which is saved)."""
    base = Path(tempfile.gettempdir()) / "tpu_pretrain" if runtime() == KAGGLE else Path.cwd() / "work"
    base.mkdir(parents=True, exist_ok=True)
    return base


def data_dir(params) -> str:
    """The shards this notebook uses: its ``data_dir`` parameter, else the project's ``data/``."""
    return params.get("data_dir") or storage.join(project_dir(params), "data")


def run_mirror(params) -> str:
    """The durable copy of the run named by ``run_name`` in the project."""
    return storage.join(project_dir(params), "runs", params.run_name)


def kaggle_input() -> Path:
    """Where Kaggle attaches inputs (``TPU_PRETRAIN_KAGGLE_INPUT`` moves it, for a simulated Kaggle)."""
    return Path(os.environ.get("TPU_PRETRAIN_KAGGLE_INPUT", KAGGLE_INPUT))


def attached_runs(run_name: str) -> list[str]:
    """Runs named ``run_name`` in the outputs attached as Kaggle inputs (an earlier version's
    ``tpu_pretrain/runs/<run_name>``, or one in any folder of an input), newest checkpoint first."""
    if runtime() != KAGGLE or not kaggle_input().is_dir():
        return []
    found = {config.parent for config in kaggle_input().glob(f"**/runs/{run_name}/{CONFIG}")}
    return [str(folder) for folder in sorted(found, key=_newest_step, reverse=True)]


def _newest_step(run: Path) -> int:
    from ..core.checkpoints import list_checkpoints

    return max((c.step for c in list_checkpoints(RunFolder(run).checkpoints)), default=-1)


def run_source(params) -> str:
    """Where the run ``run_name`` is continued from: ``resume_from``; else its durable copy in the project; else,
    on Kaggle, an earlier version's output attached as an input (unless ``start_over``); else the durable copy it
    will have."""
    if params.get("resume_from"):
        return params.resume_from
    mirror = run_mirror(params)
    if storage.exists(config_file_at(mirror)):
        return mirror
    attached = [] if params.get("start_over") else attached_runs(params.run_name)
    if attached:
        print(f"Found the run {params.run_name!r} in an attached input: {attached[0]}; it continues from there." +
              (f" (Also attached, with older checkpoints: {', '.join(attached[1:])}.)" if attached[1:] else ""))
        return attached[0]
    return mirror


def local_run_dir(params) -> str:
    """Where the run is trained: the project's folder itself when it is local, else the local disk."""
    mirror = run_mirror(params)
    return str(work_dir() / "runs" / params.run_name) if is_remote(mirror) else mirror


def local_data(path: str) -> str:
    """A local folder holding the shards at ``path``: itself, or a verified copy of a bucket or Drive folder.

    Training reads shards from local disk (both free TPU platforms are TPU VMs with one); a re-run fetches
    only what changed.
    """
    if not is_remote(path):
        return path
    local = work_dir() / "data" / hashlib.sha256(path.encode()).hexdigest()[:12]
    print(f"Copying the data from {path} to this runtime's disk ({local}):")
    print(storage.sync(path, str(local), progress=True).text())
    return str(local)


def local_eval_data(path: str) -> str:
    """A local folder with what evaluation reads of the data at ``path`` (its manifest, vocab and eval shards):
    itself, or those files copied from a bucket or Drive, not the training shards."""
    from ..data.data_folder import EVAL, MANIFEST, TOKENIZER, VOCAB, Manifest

    if not is_remote(path):
        return path
    local = work_dir() / "eval_data" / hashlib.sha256(path.encode()).hexdigest()[:12]
    manifest = Manifest.from_json(json.loads(storage.read_text(storage.join(path, MANIFEST))))
    vocab = VOCAB if storage.exists(storage.join(path, VOCAB)) else TOKENIZER  # the data's vocab.txt or tokenizer.json
    names = [MANIFEST, vocab, *manifest.files(EVAL)]
    print(f"Copying the eval shards of {path} to this runtime's disk ({len(names) - 2} shard(s); not the training "
          "shards):")
    for name in names:
        storage.copy(storage.join(path, name), str(local / name), progress=False)
    return str(local)


def require(path: str, what: str, made_by: str) -> str:
    """``path`` when it holds something, else a clear error saying which notebook makes it and where."""
    if storage.exists(path):
        return path
    hint = (" On Kaggle: save that notebook's version, then attach its output to this notebook (Add Input) and "
            "point the parameter at it under /kaggle/input.") if runtime() == KAGGLE else ""
    raise UserInputError(f"{what} is not at {path}. Run {made_by} first, or set the parameter to where it "
                         f"wrote it.{hint}")


def local_path(path: str) -> bool:
    """Whether ``path`` is a plain local (or mounted) folder, as opposed to a gs:// URL."""
    return not storage.is_gcs_url(path) and not os.fspath(path).startswith("gs:")


def corpus_files(corpus: str) -> list[str]:
    """The corpus as local paths: the built-in sample when empty, a bucket's files copied to local disk."""
    from ..data.sample_corpus import write_sample_corpus

    items = [item.strip() for item in corpus.split(",") if item.strip()]
    if not items:
        return [str(write_sample_corpus(work_dir() / "corpus" / "sample.txt"))]
    local = []
    for item in items:
        if storage.is_gcs_url(item):
            target = work_dir() / "corpus" / hashlib.sha256(item.encode()).hexdigest()[:12]
            print(storage.sync(item, str(target), progress=True).text())
            item = str(target)
        local.append(item)
    return local


def save(source: str | os.PathLike, destination: str) -> str:
    """Copy a finished folder to its durable place (verified; what is already there and identical is skipped)."""
    if local_path(destination) and Path(source).resolve() == Path(destination).resolve():
        return f"{source} is already in its durable place."
    summary = storage.sync(str(source), destination, progress=True)
    return f"Saved to {destination}: " + summary.text()
