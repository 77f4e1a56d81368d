"""What fits on the free TPUs, from the TPU compiler: the plan command over BERT and ModernBERT at their lengths.

Usage: python benchmarks/bench_tpu_plan.py [--targets v5e-1 v5e-8 v6e-1] [--rows bert-base-128 ...] [--results FILE]
           [--attention auto xla splash] [--batch N]
       python benchmarks/bench_tpu_plan.py --smoke   (a tiny BERT for each free target, or for the CPU's compiler
                                                      where no TPU compiler is installed: the machinery only)
       python benchmarks/bench_tpu_plan.py --rows modernbert-base-1024 --targets v5e-8 --cycles

Each row is ``tpu-pretrain plan`` in a process of its own (the real command, its settings as a user gives them),
compiled for each target without a TPU (``pip install 'jax[tpu]'`` beside the project). Printed per row and target:
compile time, memory per chip (weights and optimizer state, temporaries, total) against the chip's HBM, fits or the
largest batch that does (found by compiling), and XLA's FLOPs per chip-step against the project's formula (the MFU
denominator). Batches are the notebooks' defaults: 128 on a one-chip runtime (Colab's ``03``), 256 on Kaggle's
v5e-8 (``04``); the modern recipe (MLM only, 30% masking), bfloat16, as ``train`` on a TPU runs it. ``--batch``
asks another global batch (a large one makes the plan search down to the largest that fits).

``--attention`` compiles each row once per attention path (``TPU_PRETRAIN_ATTENTION`` in the plan's environment):
``auto`` (the splash kernel on a TPU at lengths that are multiples of 128, :mod:`tpu_pretrain.jax_backend.splash`),
``xla`` (XLA's attention, every score matrix materialised), ``splash`` (the kernel forced). The table's attention
column is the path asked and, after it, the path the plan's log says the layers took.

``--cycles`` also reads the TPU compiler's own estimate of each step, the cycles its cost model writes on every
instruction (XLA's dump of the compiled step, :mod:`tpu_cost_model`; a Pallas kernel, the splash kernel among them,
carries none and is counted apart): the figure docs/tpus.md sets changes side by side with (ModernBERT-base at 1,024
on a v5e-8, for one), not a speed.

Each finished plan is appended to ``--results`` (JSON lines) and skipped when the benchmark is run again, so a long
matrix (a BERT-large compile takes tens of minutes on a 2-core machine) can be run in parts; ``--table`` prints the
table of what is there.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GIB = 1 << 30
# name -> plan flags; the notebooks' model sizes and the lengths each family is trained at.
ROWS = {
    "bert-base-128": ["--model_size", "L12-H768", "--max_seq_length", "128"],
    "bert-base-512": ["--model_size", "L12-H768", "--max_seq_length", "512"],
    "bert-large-128": ["--model_size", "L24-H1024", "--max_seq_length", "128"],
    "bert-large-512": ["--model_size", "L24-H1024", "--max_seq_length", "512"],
    "modernbert-base-1024": ["--model_family", "modernbert", "--model_size", "base", "--max_seq_length", "1024",
                             "--max_position_embeddings", "8192"],
    "modernbert-base-8192": ["--model_family", "modernbert", "--model_size", "base", "--max_seq_length", "8192",
                             "--max_position_embeddings", "8192"],
    "modernbert-large-1024": ["--model_family", "modernbert", "--model_size", "large", "--max_seq_length", "1024",
                              "--max_position_embeddings", "8192"],
    "modernbert-large-8192": ["--model_family", "modernbert", "--model_size", "large", "--max_seq_length", "8192",
                              "--max_position_embeddings", "8192"],
}
SMOKE = {"bert-L2-H128-64": ["--model_size", "L2-H128", "--max_seq_length", "64", "--vocab_size", "1000"]}
DEFAULT_BATCH = {"v5e-8": 256}  # Kaggle's notebook; the one-chip runtimes' is 128
COMMON = ["--recipe", "modern", "--vocab_size", "30522", "--num_train_steps", "100000"]


ATTENTION = ("auto", "xla", "splash")  # TPU_PRETRAIN_ATTENTION, as tpu_pretrain.jax_backend.model reads it


def batch_for(target: str, batch: int | None = None) -> int:
    return batch or DEFAULT_BATCH.get(target, 128)


def attention_taken(output: str) -> str:
    """The attention path the plan's log says the layers took ("Attention: splash kernel (...)." lines)."""
    said = [line.split("Attention:", 1)[1].strip().rstrip(".") for line in output.splitlines() if "Attention:" in line]
    if any("splash" in s for s in said):
        return "splash"
    return "xla" if said else "-"


def plan_row(name: str, flags: list[str], target: str, timeout: float, attention: str = "auto",
             batch: int | None = None, cycles: bool = False) -> dict:
    """``tpu-pretrain plan`` for one row, target and attention path, in its own process; its saved plan (or why
    there is none). ``cycles``: also the TPU compiler's cost model of the step at the batch asked
    (:func:`step_cycles_of`)."""
    with tempfile.TemporaryDirectory(prefix="bench-plan-") as folder:
        saved, dumps = Path(folder) / "plan.json", Path(folder) / "hlo"
        command = [sys.executable, "-m", "tpu_pretrain", "plan", "--tpu", target, *COMMON, *flags,
                   "--train_batch_size", str(batch_for(target, batch)), "--save", str(saved)]
        start = time.perf_counter()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TPU_PRETRAIN_ATTENTION": attention}
        if cycles:  # XLA writes each compiled training step's text there, the cost model's figures on it
            env["XLA_FLAGS"] = (f"{env.get('XLA_FLAGS', '')} --xla_dump_to={dumps} --xla_dump_hlo_as_text "
                                f"--xla_dump_hlo_module_re=.*train_step.*").strip()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
            output, code = done.stdout + done.stderr, done.returncode
        except subprocess.TimeoutExpired as exc:
            output, code = f"{exc.stdout or ''}\nstopped after {timeout:.0f} s", -1
        plan = json.loads(saved.read_text()) if saved.is_file() else None
        counted = step_cycles_of(dumps) if cycles else None
    return {"row": name, "target": target, "attention": attention, "taken": attention_taken(output),
            "batch": batch_for(target, batch), "exit": code, "seconds": time.perf_counter() - start, "plan": plan,
            "output": output[-3000:], **({"cycles": counted} if cycles else {})}


def step_cycles_of(dumps: Path) -> dict | None:
    """The TPU compiler's own estimate of the first training step it compiled (the batch asked; a search compiles
    others after it), from XLA's dump of the compiled text (:func:`tpu_cost_model.step_cycles`: cycles in all and by
    opcode; Pallas kernels, the splash kernel among them, counted apart, not costed). None where nothing was dumped
    (a compile that failed, or the CPU's compiler, which writes no cycles)."""
    import tpu_cost_model

    compiled = sorted(dumps.glob("*train_step*after_codegen.txt"))
    found = tpu_cost_model.step_cycles(compiled[0].read_text()) if compiled else None
    if not found or not found["cycles"]:
        return None
    return {"cycles": found["cycles"], "copies": found["by_op"].get("copy", 0),
            "unseen_kernels": found["unseen_kernels"]}


def cycles_line(r: dict) -> str:
    """One result's cycles, as :func:`step_cycles_of` read them."""
    c = r.get("cycles")
    said = (f"{c['cycles'] / 1e6:.1f} M cycles per step by the TPU compiler's cost model (copies "
            f"{c['copies'] / 1e6:.1f} M; {c['unseen_kernels']} Pallas kernels it does not cost)"
            ) if c else "no cycles (no TPU step compiled)"
    return f"{r['row']} {r['target']} {_attention(r)} batch {r['batch']}: {said}"


def _key(r: dict) -> tuple:
    """What identifies a result: row, target, attention asked, batch asked (results from before the attention
    option are ``auto`` at the notebooks' batch)."""
    return r["row"], r["target"], r.get("attention", "auto"), r.get("batch", batch_for(r["target"]))


def _attention(r: dict) -> str:
    asked, taken = r.get("attention", "auto"), r.get("taken", "-")
    return asked if taken in ("-", asked) else f"{asked}: {taken}"


def _gib(n) -> str:
    return f"{n / GIB:.2f}" if n is not None else "-"


def _total(step: dict) -> int | None:
    return sum(step["memory"].values()) if step.get("memory") else step.get("used")


def table(results: list[dict]) -> str:
    """The README's table: one line per row and target."""
    lines = ["| model, length | target | attention | batch (per chip) | compile s (compiles: plan s) "
             "| weights+opt / temporaries / total GiB per chip "
             "| fits? (else the largest batch that does) | XLA FLOPs per chip-step / formula |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        p = r["plan"]
        if p is None:
            asked = r.get("batch", batch_for(r["target"]))
            lines.append(f"| {r['row']} | {r['target']} | {_attention(r)} | {asked} | - | - | "
                         f"no plan (exit {r['exit']}) | - |")
            continue
        a, devices = p["asked"], p["devices"]
        m = a.get("memory") or {}
        memory = (f"{_gib(m['state'])} / {_gib(m['temporaries'])} / {_gib(_total(a))} of {a['capacity'] / GIB:.0f}"
                  if m else f"needs at least {_gib(_total(a))} of {a['capacity'] / GIB:.2f}")
        if a["error"] and not a.get("used"):
            verdict = "does not compile"
        elif _total(a) is not None and _total(a) <= a["capacity"]:
            verdict = f"fits, {(a['capacity'] - _total(a)) / a['capacity']:.0%} free"
        elif p.get("largest") and p["largest"]["memory"]:
            best = p["largest"]
            verdict = f"no: {best['batch']} ({best['batch'] // devices} per chip) fits, {_gib(_total(best))} GiB"
            if p.get("accumulated") and p["accumulated"]["memory"]:
                verdict += f"; or accumulation {p['accumulated']['accumulation']}"
        else:
            verdict = "no: not one sequence per chip" if p.get("largest") is None else "no"
        flops = "-"
        if a.get("flops"):
            formula = p["formula_flops"] * a["batch"] / devices
            flops = f"{a['flops']:.3g} / {formula:.3g} ({a['flops'] / formula:.2f})"
        lines.append(f"| {r['row']} | {r['target']} | {_attention(r)} | {a['batch']} ({a['batch'] // devices}) | "
                     f"{a['seconds']:.0f} ({len(p['compiles'])}: {r['seconds']:.0f}) | "
                     f"{memory} | {verdict} | {flops} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", nargs="+", default=["v5e-1", "v5e-8", "v6e-1"])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), help=f"of {', '.join(ROWS)}")
    parser.add_argument("--results", default="bench_tpu_plan.jsonl", help="JSON lines, appended to and resumed from")
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds for one row and target")
    parser.add_argument("--attention", nargs="+", default=["auto"], choices=ATTENTION,
                        help="attention paths to compile each row with (TPU_PRETRAIN_ATTENTION)")
    parser.add_argument("--batch", type=int, default=None, help="global batch asked (default: the notebooks')")
    parser.add_argument("--smoke", action="store_true", help="a tiny BERT for each target")
    parser.add_argument("--table", action="store_true", help="only print the table of the results there")
    parser.add_argument("--cycles", action="store_true", help="also the TPU compiler's cost model of each step (cycles "
                        "per step, the kernels it does not cost counted apart): to set changes side by side")
    args = parser.parse_args(argv)
    rows = SMOKE if args.smoke else {name: ROWS[name] for name in args.rows}
    results_file = Path(args.results)
    if args.smoke:  # the machinery only: a tiny BERT, for the CPU's compiler where no TPU compiler is installed
        print("smoke run: a tiny BERT; its figures mean nothing", flush=True)
        args.cycles = True
        results_file = Path(tempfile.mkdtemp(prefix="bench-plan-smoke-")) / "results.jsonl"
        if importlib.util.find_spec("libtpu") is None:
            args.targets = ["cpu"]
    done = [json.loads(line) for line in results_file.read_text().splitlines()] if results_file.is_file() else []
    if not args.table:
        for name, flags in rows.items():
            for target in args.targets:
                for attention in args.attention:
                    if any(_key(r) == (name, target, attention, batch_for(target, args.batch))
                           and (not args.cycles or "cycles" in r) for r in done):
                        continue
                    result = plan_row(name, flags, target, args.timeout, attention, args.batch, args.cycles)
                    done.append(result)
                    with open(results_file, "a") as handle:
                        handle.write(json.dumps(result) + "\n")
                    print(table([result]).splitlines()[-1], flush=True)
                    if args.cycles:
                        print(cycles_line(result), flush=True)
    order = {name: i for i, name in enumerate(rows)}
    targets = {name: i for i, name in enumerate(args.targets)}
    paths = {name: i for i, name in enumerate(ATTENTION)}
    shown = sorted((r for r in done if r["row"] in rows),
                   key=lambda r: (order[r["row"]], targets.get(r["target"], 99), paths[r.get("attention", "auto")],
                                  r.get("batch", 0)))
    print(table(shown))
    for r in shown if args.cycles else ():
        print(cycles_line(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
