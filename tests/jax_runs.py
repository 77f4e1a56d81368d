"""A run trained with ``--backend jax`` and then used to the end (evaluate, export, probe, status) through the real
CLI, all in one Python process that reports which frameworks it loaded: the check behind "a JAX process never
imports TensorFlow", shared by the environment with TensorFlow installed and the one without it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from fault_injection import ENV

TENSORFLOW_MODULES = ("tensorflow", "tf_keras", "bert4keras")
SENTENCES = ["Return the [MASK] of the file.", "The module provides [MASK] functions. [SEP] It reads [MASK] files."]


def probe_task(corpus: Path, path: Path, rows: int = 160) -> Path:
    """A labelled file from the corpus's lines (short or long, split at the median): a probe needs two labels."""
    lines = [line.strip() for line in corpus.read_text(encoding="utf-8").splitlines()
             if len(line.strip()) > 20 and "\t" not in line][:rows]
    median = sorted(len(line) for line in lines)[len(lines) // 2]
    path.write_text("".join(f"{line}\t{'long' if len(line) > median else 'short'}\n" for line in lines),
                    encoding="utf-8")
    return path


def train_arguments(data_dir: str, run: Path, steps: int = 24) -> list[str]:
    return ["train", "--backend", "jax", "--data_dir", data_dir, "--output_dir", str(run), "--recipe", "classic",
            "--model_size", "L2-H128", "--train_batch_size", "8", "--num_train_steps", str(steps),
            "--num_warmup_steps", "2",
            "--learning_rate", "5e-3", "--save_checkpoints_steps", str(steps), "--eval_every_steps", "0",
            "--max_eval_steps", "1", "--steps_per_execution", str(steps // 2), "--session_hours", "-1"]


def use_a_jax_run_to_the_end(train_args: list[str], run: Path, task: Path, python: str = sys.executable,
                             env: dict | None = None) -> dict:
    """Train, evaluate (every eval record, batches of 8), export hf, probe and status in one process through
    ``tpu_pretrain.cli.main``; also the probe's pooled features of the run (``RUN/features.npy``). Returns what
    the process printed and the modules of TensorFlow, tf-keras and bert4keras it had loaded at the end."""
    script = textwrap.dedent(f"""
        import json, sys
        import numpy as np
        from tpu_pretrain.cli import main
        from tpu_pretrain.data.tokenization import load_tokenizer
        from tpu_pretrain.export.probe import encode_texts, pooled_features, read_task
        from tpu_pretrain.export.rebuild import load_trained_model
        run, task = {str(run)!r}, {str(task)!r}
        sentences = [a for s in {SENTENCES!r} for a in ("--sentence", s)]
        for command in ({train_args!r}, ["evaluate", run, "--all", "--eval_batch_size", "8", *sentences],
                        ["export", run, "--format", "hf"], ["probe", run, "--task", task], ["status", run]):
            print("==", command[0], flush=True)
            assert main(command) == 0, command
        trained = load_trained_model(run, max_seq_length=64)
        ids, segments = encode_texts(load_tokenizer(trained.vocab_file, trained.do_lower_case), read_task(task)[0], 64)
        np.save(run + "/features.npy", pooled_features(trained.model, ids, segments))
        print("BACKEND", trained.model.backend)
        print("LOADED", json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {TENSORFLOW_MODULES!r})))
    """)
    done = subprocess.run([python, "-c", script], capture_output=True, text=True, env=env or ENV, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    loaded = json.loads(done.stdout.split("LOADED ")[-1])
    return {"stdout": done.stdout, "loaded": loaded, "backend": done.stdout.split("BACKEND ")[-1].split()[0]}
