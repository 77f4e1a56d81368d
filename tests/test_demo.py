"""``tpu-pretrain demo``'s path, a few steps long: what a new user reads at its end. The evaluation says how many of
the held-out sequences it read and how to read them all (training's evals read 10 batches of 32 of the 416), the
fill-mask comes with its caveat, and the demo ends with the next step: README's walk-through, in this environment,
and the export loaded in transformers (done here where transformers is installed, as the line says)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

from fault_injection import ENV

from tpu_pretrain.data.data_folder import read_manifest

REPO = Path(__file__).parents[1]
STEPS = 8


def test_the_demo_explains_its_counts_and_ends_with_the_next_step(tmp_path):
    out = tmp_path / "demo_run"
    done = subprocess.run([sys.executable, "-c", f"from tpu_pretrain.demo import run_demo; run_demo({str(out)!r}, "
                           f"steps={STEPS})"], capture_output=True, text=True, timeout=900, cwd=tmp_path,
                          env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    text = done.stdout
    lines = text.splitlines()

    # the eval counts: what was read of how many, why, and how to read all
    held_out = read_manifest(out / "data").totals("eval")["instances"]
    read = json.loads((out / "run" / "evaluation.json").read_text())["eval_examples"]
    assert read == 10 * 32 < held_out, (read, held_out)
    assert (f"[5/6] evaluation of {read} of the {held_out} held-out sequences (the first 10 batches of 32, as "
            f"training's evals read; `tpu-pretrain evaluate {out / 'run'} --all` reads all {held_out})") in text, text
    assert "eval: 1 shard(s), " in text and f" {held_out} instances " in text  # the figure it points back to

    # the fill-mask, then its caveat
    fill = next(i for i, line in enumerate(lines) if "Return the [MASK] of the list." in line)
    caveat = next(i for i, line in enumerate(lines) if "its guesses are mostly the commonest words" in line)
    assert fill < caveat, text

    # the next step, last: the walk-through (a section README has), in this environment, and the export
    next_step = lines[-1]
    assert next_step.startswith("Next: your own text, as README's walk-through does it (\"Your own text on a CPU\")")
    assert "## Your own text on a CPU" in (REPO / "README.md").read_text(encoding="utf-8")
    if sys.prefix != sys.base_prefix:
        assert f"in this environment (source {Path(sys.prefix) / 'bin' / 'activate'})" in next_step, next_step
    hf = re.search(r"BertForMaskedLM\.from_pretrained\('([^']+)'\)$", next_step)
    assert hf and (tmp_path / hf[1]).is_dir(), next_step  # relative to where the demo ran
    assert "(README's step 6)" in next_step
    if importlib.util.find_spec("transformers") and importlib.util.find_spec("torch"):
        from transformers import BertForMaskedLM

        model = BertForMaskedLM.from_pretrained(str(tmp_path / hf[1]))
        assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 128
