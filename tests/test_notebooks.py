"""The notebooks, each executed by papermill in a fresh folder and kernel of its own, as on Colab and Kaggle.

A notebook may use only what survives a runtime: a Drive-like folder, the Cloud Storage emulator, Kaggle
inputs. Every kernel and step process of a test loads ``notebook_sandbox/sitecustomize.py``, which records
any file or folder touched under the test's root outside the notebook's own folder and those durable
places; a test fails on any such record. Colab and Kaggle are simulated by their environment variables, a
Kaggle input folder and secret store, and a stand-in for Colab's browser-side ``google.colab`` module.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
from fault_injection import quick_compiles

from tpu_pretrain.release import badges, install_source
from tpu_pretrain.runtime import TPU_ENVIRONMENT
from tpu_pretrain.storage import auth

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
SANDBOX = Path(__file__).resolve().parent / "notebook_sandbox"
TRAINING = ("00_setup", "03_train_colab_tpu", "04_train_kaggle_tpu", "05_resume")
# TensorFlow's C++ start-up noise: none of it may reach a notebook's output.
NOISE = re.compile(r"oneDNN custom operations|Could not find cuda drivers|failed call to cuInit|cuda_platform|"
                   r"absl::InitializeLog|TF-TRT Warning|Sharding callback duration|Unable to register cu(DNN|FFT|BLAS)|"
                   r"computation placer already registered|This TensorFlow binary is optimized")
# The platforms, simulated by their variables; a TPU VM's chips by the CPU's logical devices (JAX on the CPU).
COLAB, KAGGLE = {"COLAB_RELEASE_TAG": "test"}, {"KAGGLE_KERNEL_RUN_TYPE": "Batch"}
SIMULATED = {"local": {}, "colab": COLAB, "kaggle": KAGGLE,
             "colab_tpu": {**COLAB, "TPU_ACCELERATOR_TYPE": "v5litepod-1"},
             "kaggle_tpu": {**KAGGLE, "TPU_ACCELERATOR_TYPE": "v5litepod-8",
                            "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}}
TINY_TRAINING = dict(model_size="L2-H128", train_batch_size=8, num_train_steps=6, num_warmup_steps=1,
                     save_checkpoints_steps=3, eval_every_steps=3, keep_checkpoint_max=2)


def cells(path):
    return json.loads(path.read_text())["cells"]


# -- the committed notebooks ---------------------------------------------------------------------------
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs_and_with_one_literal_parameters_cell(path):
    notebook_cells = cells(path)
    assert notebook_cells[0]["cell_type"] == "markdown" and "What it does" in "".join(notebook_cells[0]["source"])
    assert all(not c.get("outputs") and not c.get("execution_count") for c in notebook_cells
               if c["cell_type"] == "code")
    tagged = [c for c in notebook_cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1
    for statement in ast.parse("".join(tagged[0]["source"])).body:
        assert isinstance(statement, ast.Assign), ast.dump(statement)
        ast.literal_eval(statement.value)  # literals only, so papermill and Colab forms can set them
    for cell in notebook_cells:  # the parameters form aside (assignments and their help)
        if cell["cell_type"] == "code" and cell is not tagged[0]:
            assert len("".join(cell["source"]).splitlines()) <= 15, "cells stay short: logic lives in the package"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_each_notebook_asks_for_the_accelerator_it_needs(path):
    metadata = json.loads(path.read_text())["metadata"]
    tpu = path.stem in TRAINING
    assert (metadata.get("accelerator") == "TPU") == tpu  # Colab
    assert metadata["kaggle"]["accelerator"] == ("tpuV5e8" if tpu else "none")


def test_the_install_source_and_badges_come_from_the_release():
    """Publishing changes tpu_pretrain/release.py and `python scripts/sync_release.py`, nothing by hand."""
    for path in NOTEBOOKS:
        text = "".join(cells(path)[0]["source"])
        assert badges(path.name) in text, f"{path.name}: badges differ from the release (run scripts/sync_release.py)"
        sources = ["".join(c["source"]) for c in cells(path)
                   if c["cell_type"] == "code" and '"pip", "install"' in "".join(c["source"])]
        assert sources and all(install_source() in s for s in sources), f"{path.name}: install source differs"
    readme = (REPO / "README.md").read_text()
    assert all(badges(path.name) in readme for path in NOTEBOOKS), "README badges differ from the release"


# -- running them ----------------------------------------------------------------------------------------
class Runtimes:
    """Fresh folders and kernels for notebooks, the durable places between them, and the simulated platforms."""

    def __init__(self, root: Path, monkeypatch):
        self.root, self.monkeypatch = root, monkeypatch
        self.drive = root / "drive"  # a Drive-like durable folder
        self.kaggle_input = root / "kaggle_input"  # what Kaggle attaches as inputs
        self.secrets = root / "kaggle_secrets"
        for folder in (self.drive, self.kaggle_input, self.secrets):
            folder.mkdir(parents=True)

    def run(self, name: str, folder: str, runtime: str = "local", **parameters):
        """Execute ``name`` in ``root/folder`` with a kernel of its own; fail on any non-durable read."""
        import papermill

        workdir = self.root / folder
        (workdir / "tmp").mkdir(parents=True)
        audit = self.root / f"audit-{folder}.log"
        env = {"NOTEBOOK_AUDIT_ROOT": str(self.root), "NOTEBOOK_AUDIT_LOG": str(audit),
               "NOTEBOOK_AUDIT_ALLOW": os.pathsep.join(map(str, (workdir, self.drive, self.kaggle_input,
                                                                  self.secrets))),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(SANDBOX), os.environ.get("PYTHONPATH")])),
               "TMPDIR": str(workdir / "tmp"), "TPU_PRETRAIN_CACHE_DIR": str(workdir / "cache"),
               "FAKE_COLAB_LOG": str(workdir / "colab.log"),
               "FAKE_KAGGLE_SECRETS": str(self.secrets)}
        for key in ("COLAB_RELEASE_TAG", "KAGGLE_KERNEL_RUN_TYPE", *TPU_ENVIRONMENT, "XLA_FLAGS"):
            self.monkeypatch.delenv(key, raising=False)
        env.update(SIMULATED[runtime])
        env.update(quick_compiles(env.get("XLA_FLAGS", "")))
        env["TPU_PRETRAIN_KAGGLE_INPUT"] = str(self.kaggle_input)
        env["TPU_PRETRAIN_RUNTIME_STARTED"] = str(time.time())  # a fresh runtime, whatever this machine's uptime
        for key, value in env.items():
            self.monkeypatch.setenv(key, value)
        output = self.root / "executed" / name
        output.parent.mkdir(exist_ok=True)
        try:
            papermill.execute_notebook(str(REPO / "notebooks" / name), str(output), parameters=parameters,
                                       cwd=str(workdir), kernel_name="python3", progress_bar=False)
        finally:
            reads = audit.read_text() if audit.exists() else ""
        assert not reads, f"{name} used files that do not survive a runtime:\n{reads[:3000]}"
        check_readable(output)
        return workdir, output

    def save_version(self, workdir: Path, dataset: str) -> Path:
        """Kaggle's "Save Version": the notebook's /kaggle/working becomes an input of later notebooks."""
        target = self.kaggle_input / dataset
        shutil.copytree(workdir / "working", target)
        return target


def check_readable(executed: Path) -> None:
    """The executed notebook renders, shows no traceback, and none of TensorFlow's start-up noise."""
    import nbformat

    notebook = nbformat.read(executed, as_version=4)
    try:  # the development environment renders it; the TPU images' pinned sets have no nbconvert
        from nbconvert import HTMLExporter
    except ImportError:
        HTMLExporter = None
    if HTMLExporter is not None:
        HTMLExporter().from_notebook_node(notebook)
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            assert output["output_type"] != "error", f"{executed.name}: {output.get('ename')}: {output.get('evalue')}"
            text = output.get("text", "") or json.dumps(output.get("data", {}))
            assert "Traceback (most recent call last)" not in text, f"{executed.name}: a traceback:\n{text[-2000:]}"
            noise = NOISE.search(text)
            assert not noise, f"{executed.name}: TensorFlow start-up noise in an output: {noise.group()}"


@pytest.fixture
def runtimes(tmp_path, monkeypatch, bucket):
    yield Runtimes(tmp_path, monkeypatch)
    auth.reset()


def outputs(executed: Path) -> str:
    """What the cells of an executed notebook printed (not their sources)."""
    import nbformat

    notebook = nbformat.read(executed, as_version=4)
    return "\n".join(o.get("text", "") or json.dumps(o.get("data", {})) for c in notebook.cells
                     for o in c.get("outputs", []))


def assert_jax_without_tensorflow(workdir: Path, printed: str) -> None:
    """The run trained (or was used) with JAX and no TensorFlow environment was built or installed for it."""
    assert "Backend: jax" in printed and "no TensorFlow needed" in printed
    assert "Installing the TensorFlow stack" not in printed and "tpu-venv" not in printed
    assert not (workdir / "cache" / "tpu-venv").exists()


# The image-exact environments (make test-tpu-images): each platform's TPU notebook, its plan compiled by the image's
# own TPU compiler for the TPU the runtime names, then training on CPU devices standing in for the chips.
IMAGE_NOTEBOOK = {"colab": ("03_train_colab_tpu.ipynb", "colab_tpu", "v5e-1"),
                  "kaggle": ("04_train_kaggle_tpu.ipynb", "kaggle_tpu", "v5e-8")}


@pytest.mark.tpu_image
@pytest.mark.skipif(os.environ.get("TPU_PRETRAIN_IMAGE") not in IMAGE_NOTEBOOK,
                    reason="in the image-exact environments (make test-tpu-images)")
def test_the_tpu_image_notebook_checks_its_plan_then_trains(runtimes):
    from fault_injection import sample_data

    name, runtime, target = IMAGE_NOTEBOOK[os.environ["TPU_PRETRAIN_IMAGE"]]
    data = sample_data(runtimes.kaggle_input / "prepared", max_chars=60_000, num_shards=2, workers=1, recipe="modern")
    workdir, output = runtimes.run(name, "train", runtime, data_dir=data,
                                   project_dir=str(runtimes.drive / "tpu_pretrain"), **TINY_TRAINING)
    printed = outputs(output)
    assert_jax_without_tensorflow(workdir, printed)
    assert f"Plan for {target}" in printed and "FITS" in printed and "Compiled by the TPU compiler" in printed
    assert list((runtimes.drive / "tpu_pretrain" / "runs" / "bert" / "checkpoints").glob("ckpt-000000006"))
    if runtime == "colab_tpu":  # before switching to a TPU runtime: 00 on a CPU runtime plans for the chosen TPU
        _, output = runtimes.run("00_setup.ipynb", "setup", "colab", project_dir=str(runtimes.drive / "tpu_pretrain"),
                                 model_size="L2-H128", train_batch_size=8, max_seq_length=64, plan_for_tpu="v5e-1")
        assert "Plan for v5e-1" in outputs(output) and "Planned for a v5e-1: these settings fit" in outputs(output)


@pytest.mark.slow
def test_the_colab_tpu_path_each_notebook_on_a_fresh_runtime(runtimes, bucket):
    """Colab: data on a CPU runtime, training and resume on a TPU runtime with the image's JAX, the modern recipe."""
    project = f"gs://{bucket}/project"
    drive_project = str(runtimes.drive / "tpu_pretrain")
    workdir, output = runtimes.run("00_setup.ipynb", "setup", "colab_tpu", project_dir=project,
                                   model_size="L2-H128", train_batch_size=8)
    printed = outputs(output)  # what 03 will train with, measured: JAX, not the TensorFlow TPU environment
    assert "Accelerator check: no TPU or GPU here, the steps ran on the CPU" in printed
    assert "sequences/s" in printed and "checkpoint saved and restored" in printed
    assert not (workdir / "cache" / "tpu-venv").exists()
    check = json.loads(auth.storage_client().bucket(bucket).blob("project/accelerator_check.json").download_as_text())
    assert check["model_size"] == "L2-H128" and check["sequences_per_second"] > 0
    _, output = runtimes.run("01_prepare_data.ipynb", "prepare", "colab", project_dir=drive_project,
                             vocab_size=3000, dupe_factor=1, max_seq_length=64)
    assert (runtimes.drive / "tpu_pretrain" / "data" / "manifest.json").is_file()
    assert "(packed, fill 0.9" in outputs(output)  # the modern recipe's packing, and how full it is
    runtimes.run("02_upload_to_gcs.ipynb", "upload", "colab", project_dir=drive_project,
                 gcs_url=f"{project}/data", transfer_workers=4)
    names = {b.name for b in auth.storage_client().list_blobs(bucket, prefix="project/data/")}
    assert "project/data/manifest.json" in names and any(n.endswith(".tfrecord") for n in names)

    workdir, output = runtimes.run("03_train_colab_tpu.ipynb", "train", "colab_tpu", project_dir=project,
                                   **TINY_TRAINING)
    assert_jax_without_tensorflow(workdir, outputs(output))
    mirrored = {b.name for b in auth.storage_client().list_blobs(bucket, prefix="project/runs/bert/")}
    assert "project/runs/bert/checkpoints/ckpt-000000006/checkpoint.json" in mirrored
    # A fresh runtime: the run comes back from its mirror and goes on to step 9, on the backend it started with.
    workdir, output = runtimes.run("05_resume.ipynb", "resume", "colab_tpu", project_dir=project, num_train_steps=9,
                                   rewarm_steps=2)  # the run had finished: a new phase
    assert_jax_without_tensorflow(workdir, outputs(output))
    assert (workdir / "work" / "runs" / "bert" / "checkpoints" / "ckpt-000000009").is_dir()
    workdir, output = runtimes.run("06_evaluate_and_export.ipynb", "evaluate", "colab", project_dir=project,
                                   top_k=3)
    assert_jax_without_tensorflow(workdir, outputs(output))
    assert "not the training shards" in outputs(output)  # only what evaluation reads was copied
    copied = workdir / "work" / "eval_data"
    assert list(copied.glob("*/eval-*")) and not list(copied.glob("*/train-*"))
    exported = {b.name for b in auth.storage_client().list_blobs(bucket, prefix="project/exports/bert/")}
    assert {"project/exports/bert/hf/model.safetensors", "project/exports/bert/tf/bert_model.ckpt.index"} <= exported
    assert "files.download" in (workdir / "colab.log").read_text()  # the zip offered to the browser
    assert "[MASK] 1:" in output.read_text()  # transformers' own fill-mask on the export


@pytest.mark.slow
def test_the_kaggle_tpu_path_without_a_bucket(runtimes, bucket):
    """Kaggle: a v5e-8 (eight CPU devices standing in), outputs attached as inputs; a second session of 04 finds
    its earlier output and continues it without being told."""
    corpus = runtimes.kaggle_input / "my-corpus"
    corpus.mkdir()
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tpu_pretrain.data.sample_corpus import write_sample_corpus

    text = write_sample_corpus(runtimes.root / "corpus.txt", max_chars=120_000).read_text()
    documents = [d for d in text.split("\n\n") if d.strip()]  # a Kaggle dataset of rows, one document each
    pq.write_table(pa.table({"id": list(range(len(documents))), "text": documents}), corpus / "corpus.parquet")
    working = "working/tpu_pretrain"  # the notebook's /kaggle/working
    workdir, _ = runtimes.run("01_prepare_data.ipynb", "prepare", "kaggle", corpus=str(corpus / "*.parquet"),
                              project_dir=str(runtimes.root / "prepare" / working), vocab_size=2000,
                              dupe_factor=1, max_seq_length=64)
    data = runtimes.save_version(workdir, "prepare-output") / "tpu_pretrain" / "data"

    key = {"type": "service_account", "client_email": "trainer@project.iam.gserviceaccount.com",
           "private_key": "-----BEGIN PRIVATE KEY-----\nNOT-A-REAL-KEY\n-----END PRIVATE KEY-----\n"}
    (runtimes.secrets / "GCS_SERVICE_ACCOUNT_KEY").write_text(json.dumps(key))
    _, output = runtimes.run("02_upload_to_gcs.ipynb", "upload", "kaggle", data_dir=str(data),
                             gcs_url=f"gs://{bucket}/from-kaggle/data", transfer_workers=2)
    text = output.read_text()
    assert "trainer@project.iam.gserviceaccount.com" in text and "NOT-A-REAL-KEY" not in text

    # The first session ends (its deadline, here a moment after the start) after the first steps are saved.
    workdir, output = runtimes.run("04_train_kaggle_tpu.ipynb", "train", "kaggle_tpu", data_dir=str(data),
                                   project_dir=str(runtimes.root / "train" / working), session_hours=1e-5,
                                   session_margin_minutes=0, **TINY_TRAINING)
    printed = outputs(output)
    assert_jax_without_tensorflow(workdir, printed)
    assert "CPU: 8 device(s)" in printed  # every logical device a data-parallel replica
    assert "attach this notebook's output as an input" in printed  # what to do next, on Kaggle
    run = runtimes.save_version(workdir, "train-output") / "tpu_pretrain" / "runs" / "bert"
    stopped_at = max(int(c.name[5:]) for c in (run / "checkpoints").glob("ckpt-*"))
    assert 0 < stopped_at < 6
    # The next session: the same notebook, its earlier output attached, no resume_from: it goes on from there.
    workdir, output = runtimes.run("04_train_kaggle_tpu.ipynb", "train2", "kaggle_tpu", data_dir=str(data),
                                   project_dir=str(runtimes.root / "train2" / working), session_hours=0,
                                   **TINY_TRAINING)  # 0: Kaggle's own 9 hours
    printed = outputs(output)
    assert f"Found the run 'bert' in an attached input: {run}" in printed
    assert f"step {stopped_at} of 6" in printed
    assert (workdir / working / "runs" / "bert" / "checkpoints" / "ckpt-000000006").is_dir()
    run = runtimes.save_version(workdir, "train2-output") / "tpu_pretrain" / "runs" / "bert"
    workdir, _ = runtimes.run("05_resume.ipynb", "resume", "kaggle_tpu", resume_from=str(run), data_dir=str(data),
                              project_dir=str(runtimes.root / "resume" / working), num_train_steps=9,
                              rewarm_steps=2)  # the run had finished: a new phase
    assert (workdir / working / "runs" / "bert" / "checkpoints" / "ckpt-000000009").is_dir()


@pytest.mark.slow
def test_the_quickstart_goes_from_nothing_to_an_export(runtimes):
    workdir, output = runtimes.run("07_quickstart.ipynb", "quickstart", project_dir="tpu_pretrain",
                                   max_seq_length=64, model_size="L2-H128", train_batch_size=16, num_train_steps=20,
                                   num_warmup_steps=2, save_checkpoints_steps=10, eval_every_steps=10,
                                   sentences="Open the [MASK] for reading.|Close the [MASK].")
    durable = workdir / "tpu_pretrain"  # project_dir: what outlives the runtime (the work/ folder does not)
    assert (durable / "exports" / "quickstart" / "hf" / "model.safetensors").is_file()
    assert (durable / "quickstart_data" / "manifest.json").is_file()
    assert (workdir / "work" / "quickstart-hf.zip").is_file()
    printed = outputs(output)
    assert "Open the [MASK] for reading." in printed and "Close the [MASK]." in printed  # the sentences parameter
    import nbformat

    training = next(c for c in nbformat.read(output, as_version=4).cells if "nb.train(" in c.source)
    block = next(o for o in training.outputs if "Training backend:" in json.dumps(o.get("data", {})))
    assert "Learning rate:" in block["data"]["text/plain"]  # one block of lines, not an output (a paragraph) each


def test_a_missing_input_a_placeholder_or_no_tpu_stops_the_notebook_early_with_what_to_do(runtimes):
    import papermill

    with pytest.raises(papermill.PapermillExecutionError, match="Run 01_prepare_data first"):
        runtimes.run("03_train_colab_tpu.ipynb", "no_data", project_dir=str(runtimes.drive / "empty"),
                     require_tpu=False)
    with pytest.raises(papermill.PapermillExecutionError, match="Replace the placeholder.*gcs_url"):
        runtimes.run("02_upload_to_gcs.ipynb", "placeholder")
    with pytest.raises(papermill.PapermillExecutionError, match="No TPU on this runtime.*Phone verification"):
        runtimes.run("04_train_kaggle_tpu.ipynb", "no_tpu", "kaggle", data_dir=str(runtimes.kaggle_input / "data"))
    with pytest.raises(papermill.PapermillExecutionError, match="No TPU on this runtime.*Change runtime type"):
        runtimes.run("03_train_colab_tpu.ipynb", "no_tpu_colab", "colab", project_dir=str(runtimes.drive / "p"))
    # 06 without the run: refused before anything is installed
    with pytest.raises(papermill.PapermillExecutionError, match="The run's durable copy is not at") as caught:
        runtimes.run("06_evaluate_and_export.ipynb", "no_run", project_dir=str(runtimes.drive / "empty"))
    assert "Installing" not in str(caught.value) and "Stack:" not in outputs(runtimes.root / "executed" /
                                                                          "06_evaluate_and_export.ipynb")


def test_the_words_of_every_notebook_name_what_exists():
    """A notebook's help (markdown cells, form help) names only notebooks, commands and parameters that exist."""
    from tpu_pretrain.cli.parser import build_parser
    from tpu_pretrain.config import all_fields

    commands = set(next(a for a in build_parser()._actions if a.dest == "command").choices)
    stems = {p.stem for p in NOTEBOOKS}
    numbers = {stem[:2] for stem in stems}
    problems = []
    for path in NOTEBOOKS:
        notebook_cells = cells(path)
        tagged = next(c for c in notebook_cells if "parameters" in c.get("metadata", {}).get("tags", []))
        names = {t.id for s in ast.parse("".join(tagged["source"])).body for t in s.targets}
        known = names | set(all_fields())
        words = "\n".join("".join(c["source"]) for c in notebook_cells if c["cell_type"] == "markdown")
        words += "\n" + "\n".join(line for c in notebook_cells for line in "".join(c["source"]).splitlines()
                                  if line.lstrip().startswith("#@markdown"))
        words = re.sub(r"\(https?://[^)]*\)", "", words)  # the badges' links
        problems += [f"{path.name}: notebook {n}" for n in re.findall(r"\b0\d_[a-z_]+[a-z]", words) if n not in stems]
        problems += [f"{path.name}: notebook {n}" for n in re.findall(r"`(\d\d)`", words) if n not in numbers]
        problems += [f"{path.name}: command {c}" for c in re.findall(r"tpu-pretrain ([a-z][a-z-]*)", words)
                     if c not in commands]
        problems += [f"{path.name}: parameter {n}" for n in re.findall(r"`([a-z][a-z0-9]*(?:_[a-z0-9]+)+)`", words)
                     if n not in known and n not in stems]
    assert not problems, problems
