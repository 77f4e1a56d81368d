"""The notebooks: committed clean, parameterisable, and executed headlessly with papermill on CPU."""

import ast
import json
from pathlib import Path

import pytest

from tpu_pretrain.storage import auth

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def _cells(path):
    return json.loads(path.read_text())["cells"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs_and_with_one_literal_parameters_cell(path):
    cells = _cells(path)
    assert cells[0]["cell_type"] == "markdown" and "What it does" in "".join(cells[0]["source"])
    assert all(not c.get("outputs") and not c.get("execution_count") for c in cells if c["cell_type"] == "code")
    tagged = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1
    for statement in ast.parse("".join(tagged[0]["source"])).body:
        assert isinstance(statement, ast.Assign), ast.dump(statement)
        ast.literal_eval(statement.value)  # literals only, so papermill and Colab forms can set them
    for cell in cells:
        if cell["cell_type"] == "code":
            assert len("".join(cell["source"]).splitlines()) <= 15, "cells stay short: logic lives in the package"


def run_notebook(name, tmp_path, **parameters):
    import papermill

    return papermill.execute_notebook(
        str(NOTEBOOKS[0].parent / name), str(tmp_path / f"out_{name}"), parameters=parameters,
        cwd=str(tmp_path), kernel_name="python3", progress_bar=False, request_save_on_cell_execute=False,
    )


def test_every_notebook_runs_headlessly_in_order(tmp_path, bucket):

    run_notebook("00_setup.ipynb", tmp_path, gcs_url=f"gs://{bucket}/run")
    run_notebook("01_prepare_data.ipynb", tmp_path, run_dir="run", vocab_size=3000, dupe_factor=1,
                 max_seq_length=64, max_predictions_per_seq=10)
    assert (tmp_path / "run" / "data" / "manifest.json").is_file()
    run_notebook("02_upload_to_gcs.ipynb", tmp_path, local_dir="run/data", gcs_url=f"gs://{bucket}/run/data",
                 workers=4)
    names = {b.name for b in auth.storage_client().list_blobs(bucket, prefix="run/data/")}
    assert "run/data/manifest.json" in names and any(n.endswith(".tfrecord") for n in names)

    tiny = dict(model_size="L2-H128", train_batch_size=8, num_train_steps=6, num_warmup_steps=1,
                save_checkpoints_steps=3, eval_every_steps=3, keep_checkpoint_max=2)
    run_notebook("03_train_colab_tpu.ipynb", tmp_path, data_dir="run/data", run_dir="run/colab",
                 mirror_dir=str(tmp_path / "drive_mirror"), keep_alive=False, **tiny)
    assert (tmp_path / "run" / "colab" / "checkpoints" / "ckpt-000000006").is_dir()
    run_notebook("04_train_kaggle_tpu.ipynb", tmp_path, data_dir=f"gs://{bucket}/run/data", run_dir="run/kaggle",
                 mirror_dir=f"gs://{bucket}/run/kaggle", kaggle_secret_name="", **tiny)
    assert (tmp_path / "run" / "kaggle" / "checkpoints" / "ckpt-000000006").is_dir()
    # A fresh runtime: the run comes back from its (Drive-like) mirror and goes on to step 9.
    run_notebook("05_resume.ipynb", tmp_path, run_dir="run/fresh", mirror_dir=str(tmp_path / "drive_mirror"),
                 data_dir="run/data", num_train_steps=9)
    assert (tmp_path / "run" / "fresh" / "checkpoints" / "ckpt-000000009").is_dir()
    run_notebook("06_evaluate_and_export.ipynb", tmp_path, run_dir="run/fresh", top_k=3,
                 export_to=str(tmp_path / "exports"))
    assert (tmp_path / "exports" / "hf" / "model.safetensors").is_file()
    assert (tmp_path / "run" / "fresh" / "evaluation.json").is_file()
    auth.reset()
