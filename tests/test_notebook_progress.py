"""What a notebook cell shows while a resumed run trains: ``stream()`` run in a real Jupyter kernel on a real
process that prints a resumed run's output. The bar starts at the first step reported and shows no rate or ETA
of its own (tqdm's, counting the resumed steps as done in an instant, were absurd); the run's own line is shown
whole, updated in place; the other messages are shown as they come, in blocks of text."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipywidgets")

LINES = [
    "Resuming from /content/run/checkpoints/ckpt-000001000: step 1000 of 3000.",
    "step 1100/3000: loss 6.2143, mlm_loss 5.6012, mlm_accuracy 0.1734, nsp_loss 0.6131, nsp_accuracy 0.6641, "
    "lr 9.63e-05, 3.41 steps/s, 872.9 sequences/s, MFU 38.7%, input wait 1%, ETA 0:09:17; durable step 1000",
    "Saved checkpoint /content/run/checkpoints/ckpt-000001200 (1.2 GiB) in 3.1 s.",
    "step 1200/3000: loss 6.1020, mlm_loss 5.4977, mlm_accuracy 0.1846, nsp_loss 0.6043, nsp_accuracy 0.6719, "
    "lr 9.26e-05, 3.40 steps/s, 870.4 sequences/s, MFU 38.6%, input wait 1%, ETA 0:08:49; durable step 1000, "
    "2 behind, failing: no room (quota or disk full)",
    "Trained to step 1200 in /content/run; last train loss 6.1020.",
]


def run_cell(code: str, tmp_path) -> tuple[list[dict], dict]:
    """Execute ``code`` as one cell in a fresh kernel; its outputs and the widgets' state."""
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    client = nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    widgets = notebook.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    return notebook.cells[0].outputs, widgets.get("state", {})


def test_a_resumed_runs_progress_in_a_notebook_cell(tmp_path):
    printer = f"import time\nfor line in {LINES!r}:\n    print(line)\n    time.sleep(0.3)\n"
    code = textwrap.dedent(f"""
        import os, sys
        from tpu_pretrain.notebook.steps import stream
        print("exit", stream([{sys.executable!r}, "-c", {printer!r}], None, 30.0, dict(os.environ)))
    """)
    outputs, widgets = run_cell(code, tmp_path)
    assert not [o for o in outputs if o["output_type"] == "error"], outputs
    printed = "".join(o.get("text", "") for o in outputs if o["output_type"] == "stream")
    assert printed.splitlines() == ["exit 0"]  # the cell's own print; the process's lines are shown as below
    # The run's line, whole and updated in place: one display holding the newest; the other lines in blocks of text
    # (not an output each, which a saved notebook spaces apart), a new one below the bar once it is shown.
    shown = [o["data"]["text/plain"] for o in outputs
             if o["output_type"] == "display_data" and "application/vnd.jupyter.widget-view+json" not in o["data"]]
    assert shown == [LINES[0], LINES[3], f"{LINES[2]}\n{LINES[4]}"]
    # The bar: from step 1100 (the first reported) to 1200 of 3000, with no rate or ETA of tqdm's.
    texts = [m["state"]["value"].replace("\u2007", " ") for m in widgets.values() if m["model_name"] == "HTMLModel"]
    bars = [m["state"] for m in widgets.values() if m["model_name"] in ("FloatProgressModel", "IntProgressModel")]
    print(json.dumps({"texts": texts, "bar": [(b["value"], b["max"]) for b in bars]}))
    assert [(b["value"], b["max"]) for b in bars] == [(1200, 3000)]
    assert [text.strip() for text in texts] == ["training:  40%", "1200/3000 steps"]  # tqdm spaces with U+2007
