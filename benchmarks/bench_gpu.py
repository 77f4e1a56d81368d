"""One run on a GPU machine: the JAX step, the training command's steady rate, both PyTorch peers and ModernBERT-base
at length 1,024 against transformers', printed as one table and written as JSON.

Usage: PYTHONPATH=KERAS_WHEELS python benchmarks/bench_gpu.py [--corpus ../shared/corpora/wikitext2_valid.txt]
           [--json $OUT/bench_gpu.json] [--skip step command command_step torch modernbert_hf modernbert_jax]
           [--budget_s 420]
           [--smoke]

Made for an image with JAX on CUDA, PyTorch and transformers but no Keras: Keras and the few wheels it lacks come on
``PYTHONPATH``, the package from this checkout. Each phase runs in processes of its own, so each framework has the
GPU to itself and a failure or a hang costs only that phase (said in the table, the others go on); a phase gets its
share of ``--budget_s`` (7 minutes; about 6.5 estimated for one H100, compiles included) and is stopped at it:

1. ``step``: ``bench_train_jax.py`` (BERT-base, length 128, batch 256, 20 steps per call, dropout 0): the JAX
   step alone, on random data, then one call traced: the device time by kind and model part, in the JSON and,
   with the trace and the optimised HLO, in ``bench_gpu_logs/step_profile/``.
2. ``command``: ``tpu-pretrain vocab`` and ``create-data`` (modern recipe) on ``--corpus``, then
   ``tpu-pretrain train --backend jax --model_size base --train_batch_size 256 --num_train_steps 300
   --log_every_steps 50`` as a user runs it: the summary's ``examples_per_second``, the steady rate between its
   progress lines (timed as they arrive, the first interval, compiles and all, left out), the rate its last line
   shows, its wall time, and "compiled in N s" where the log says so.
   ``command_step``: ``bench_train_jax.py --data_dir`` on that data: the step alone on the command's workload (its
   predictions per sequence, documents apart), whose rate over the command's is what the loop costs (the step on
   random data has 20 predictions and no documents: another workload).
3. ``torch``: ``bench_train_torch_peer.py`` (Hugging Face ``BertForPreTraining``, SDPA, bfloat16 autocast, fused
   AdamW) eager and under ``torch.compile``, dropout 0 as the step.
4. ``modernbert_hf``, ``modernbert_jax``: ModernBERT-base at length 1,024, batch 32: transformers'
   ``ModernBertForMaskedLM`` (eager, SDPA, bfloat16 autocast, fused AdamW; random tokens, 30% of the positions
   labelled; its head computes logits at every position, which is not counted), and the JAX trainer built as
   bench_train_jax.py builds it, 5 steps per call, on ``create-data`` rows of 1,024 tokens from the corpus (packed,
   documents kept apart: what the command trains on).

Why: issue 42. The command trained at a third of its own step on an H200, and the step is below PyTorch's; this is
the one script that measures all of it on one card, with the ratios the issue sets as goals. MFU from the project's
FLOP counts (:func:`tpu_pretrain.models.bert_config.training_flops_per_sequence`,
:func:`tpu_pretrain.models.modernbert_config.training_flops_per_sequence`) against the card's published peak
(:mod:`tpu_pretrain.core.peaks`). Every phase's output is echoed and kept in ``bench_gpu_logs/`` beside the JSON.
JAX may take 92% of the GPU's memory (``XLA_PYTHON_CLIENT_MEM_FRACTION``, unless set; its default 75% of an H100 may
not hold ModernBERT at 1,024, batch 32), which changes no speed.
``--smoke``: the same phases on the CPU (L2-H128 and ModernBERT's smallest size, length 64, tiny batches, a few
steps, torch.compile with ``aot_eager``, the built-in sample corpus) in one to two minutes on two cores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_train_jax import data_shape, flops_per_sequence  # noqa: E402
from support import parse_args  # noqa: E402

from tpu_pretrain.core.peaks import published_peak  # noqa: E402
from tpu_pretrain.data.vocab import SPECIAL_TOKENS  # noqa: E402
from tpu_pretrain.models import bert_config, modernbert_config  # noqa: E402

PY, BENCH = sys.executable, ROOT / "benchmarks"
# name: (most seconds, least seconds worth starting it with), in the order they run
PHASES = {"step": (120, 50), "command": (220, 100), "command_step": (100, 45), "torch": (150, 70),
          "modernbert_hf": (80, 20), "modernbert_jax": (160, 70)}
MASKED = 0.3  # the modern recipe's masking rate
POSITIONS = 8192  # ModernBERT-base's max_position_embeddings (RoPE: no table, no compute)


def grab(pattern: str, text: str, kind=float):
    """The first group of ``pattern``'s first match in ``text`` as ``kind``; None without one."""
    match = re.search(pattern, text, re.MULTILINE)
    return kind(match[1]) if match else None


class Runner:
    """Runs a phase's commands from the repository root until a deadline, echoing their output (kept with the
    seconds at which each line arrived) and appending it to the phase's log."""

    def __init__(self, logs: Path):
        self.logs = logs
        self.env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": ".92", **os.environ, "KERAS_BACKEND": "jax",
                    "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}

    def __call__(self, phase: str, cmd: list, until: float) -> tuple[list[tuple[float, str]], str, float]:
        cmd, start = [str(c) for c in cmd], time.perf_counter()
        limit, what = until - start, f"tpu-pretrain {cmd[3]}" if cmd[1] == "-m" else Path(cmd[1]).name
        if limit < 1:
            raise TimeoutError(f"no time left for {what}")
        self.logs.mkdir(parents=True, exist_ok=True)
        process = subprocess.Popen(cmd, cwd=ROOT, env=self.env, text=True, errors="replace", stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        timer = threading.Timer(limit, kill, (process,))
        timer.start()
        lines = []
        try:
            with open(self.logs / f"{phase}.log", "a") as log:
                log.write(f"$ {' '.join(cmd)}\n")
                for line in process.stdout:
                    lines.append((time.perf_counter() - start, line.rstrip("\n")))
                    print(f"[{phase}] {line}", end="", flush=True)
                    log.write(line)
            code = process.wait()
        finally:
            timer.cancel()
            kill(process)  # whatever it left running
        seconds = time.perf_counter() - start
        if code:
            late = f" (stopped at its {limit:.0f} s limit)" if seconds >= limit - 1 else ""
            last = f": {lines[-1][1][-300:]}" if lines else ""
            raise RuntimeError(f"{what} exited with {code} after {seconds:.0f} s{late}{last}")
        return lines, "\n".join(line for _, line in lines), seconds


def kill(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def smoke_flag(args) -> list[str]:
    return ["--smoke"] if args.smoke else []


def data_folder(args, run: Runner, until: float, phase: str, vocab_size: int, seq: int) -> Path:
    """A vocab and a ``create-data`` folder (modern recipe) from the corpus by the command line, made once per
    vocab size and length; over 512 tokens with ``max_position_embeddings`` in a ``--config`` file, as create-data
    refuses such lengths without it (it has no such flag)."""
    folder = args.work / f"data-v{vocab_size}-l{seq}"
    if (folder / "data" / "manifest.json").is_file():
        return folder / "data"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "positions.json").write_text(json.dumps({"model": {"max_position_embeddings": POSITIONS}}))
    tpu_pretrain = [PY, "-m", "tpu_pretrain"]
    run(phase, [*tpu_pretrain, "vocab", "--input", args.corpus, "--vocab_size", vocab_size, "--output_dir",
                folder / "vocab"], until)
    positions = ["--config", folder / "positions.json"] if seq > 512 else []
    run(phase, [*tpu_pretrain, "create-data", *positions, "--input", args.corpus, "--vocab_file",
                folder / "vocab" / "vocab.txt", "--max_seq_length", seq, "--output_dir", folder / "data"], until)
    return folder / "data"


def modernbert_shape(args) -> modernbert_config.ModernBertConfig:
    """The ModernBERT both sides build: the named size, ``--mb_vocab`` rows, the special tokens' ids as `tpu-pretrain
    vocab` writes them (the JAX trainer takes its ids from that vocab; they change no compute)."""
    return modernbert_config.modernbert_config_for_size(args.mb_size, args.mb_vocab, POSITIONS,
                                                        **modernbert_config.vocab_token_ids(list(SPECIAL_TOKENS)))


def predictions(data: Path | None, seq: int) -> int:
    """The data's masked positions per sequence (as many as 30% masking fills without the data)."""
    if data is not None and (data / "manifest.json").is_file():
        return data_shape(data)[1]
    return math.ceil(MASKED * seq)


# -- the phases: each returns its figures (sequences/s as "rate", GFLOP per sequence as "gflop") -------------------
def phase_step(args, run: Runner, until: float) -> dict:
    profiled = run.logs / "step_profile"
    _, text, _ = run("step", [PY, BENCH / "bench_train_jax.py", "--model_size", args.model_size, "--batch", args.batch,
                              "--steps", args.step_steps, "--steps_per_execution", args.steps_per_execution,
                              "--profile", profiled, *smoke_flag(args)], until)
    profile = json.loads((profiled / "profile.json").read_text()) if (profiled / "profile.json").exists() else {}
    return {"rate": grab(r"training: ([\d.]+) sequences/s", text), "first_s": grab(r"first call ([\d.]+) s", text),
            "gflop": grab(r"([\d.]+) GFLOP per training sequence", text),
            "device": grab(r"^device: .*\((.*?)\); model", text, str),
            "input_wait": grab(r"waited on input ([\d.]+)%", text),
            "profile": {k: profile[k] for k in ("ms_per_step", "by_kind", "by_part", "note", "tracks")
                        if k in profile}}


def phase_command(args, run: Runner, until: float) -> dict:
    started = time.perf_counter()
    data = data_folder(args, run, until, "command", args.vocab, args.seq)
    data_s, output = time.perf_counter() - started, args.work / "run-command"
    shutil.rmtree(output, ignore_errors=True)
    lines, text, wall = run("command", [
        PY, "-m", "tpu_pretrain", "train", "--backend", "jax", "--model_size", args.model_size, "--train_batch_size",
        args.batch, "--num_train_steps", args.train_steps, "--log_every_steps", args.log_every, "--data_dir", data,
        "--output_dir", output], until)
    summary = json.loads((output / "train_summary.json").read_text())
    shown = {}  # step -> (seconds when its progress line arrived, the rate it showed)
    for seconds, line in lines:
        match = re.search(r"step (\d+)/\d+: .*?(\d[\d.]*) (?:sequences|examples)/s", line)
        if match:
            shown.setdefault(int(match[1]), (seconds, float(match[2])))
    steps = sorted(shown)
    out = {"rate": summary.get("examples_per_second"), "wall_s": wall, "data_s": data_s,
           "seconds_to_first_step": summary.get("seconds_to_first_step"),
           "input_wait_share": summary.get("input_wait_share"), "compiled_s": grab(r"compiled in ([\d.]+) s", text),
           "last_line_rate": shown[steps[-1]][1] if steps else None, "steady_rate": None}
    if len(steps) >= 3:  # from the second progress line: the first interval holds the compiles
        a, b = steps[1], steps[-1]
        out.update(steady_rate=(b - a) * args.batch / (shown[b][0] - shown[a][0]), steady_steps=[a, b])
    cfg = bert_config.bert_config_for_size(args.model_size, args.vocab)
    out["gflop"] = flops_per_sequence(cfg, args.seq, predictions(data, args.seq), mlm_only=True) / 1e9
    return out


def phase_command_step(args, run: Runner, until: float) -> dict:
    """The JAX step alone (``bench_train_jax.py --data_dir``) on the command's own data: its predictions per
    sequence and documents apart, so that the command's rate over this one is what its loop costs."""
    data = data_folder(args, run, until, "command_step", args.vocab, args.seq)
    _, text, _ = run("command_step", [PY, BENCH / "bench_train_jax.py", "--model_size", args.model_size, "--batch",
                                      args.batch, "--steps", args.step_steps, "--steps_per_execution",
                                      args.steps_per_execution, "--data_dir", data, *smoke_flag(args)], until)
    return {"rate": grab(r"training: ([\d.]+) sequences/s", text), "first_s": grab(r"first call ([\d.]+) s", text),
            "gflop": grab(r"([\d.]+) GFLOP per training sequence", text)}


def phase_torch(args, run: Runner, until: float) -> dict:
    _, text, _ = run("torch", [PY, BENCH / "bench_train_torch_peer.py", "--model_size", args.model_size, "--batch",
                               args.batch, "--modes", "eager", "compile", "--dropout", "0", *smoke_flag(args)], until)
    out = {"gflop": grab(r"([\d.]+) GFLOP per training sequence", text),
           "device": grab(r"^device: ([^;]+);", text, str)}
    for mode in ("eager", "compile"):
        out[mode] = {"rate": grab(rf"^{mode}\s+batch\s+\d+: ([\d.]+) sequences/s", text),
                     "first_s": grab(rf"^{mode}\s+batch.*first call ([\d.]+) s", text)}
    return out


def child(args, run: Runner, until: float, phase: str, data: Path | None = None) -> dict:
    """This script run again as ``--phase`` (each framework in a process of its own): its result line."""
    extra = ["--data", data] if data else []
    _, text, _ = run(phase, [PY, Path(__file__), *sys.argv[1:], "--phase", phase, *extra], until)
    said = grab(r"^result: (.*)$", text, str)
    if said is None:
        raise RuntimeError(f"the {phase} process gave no result line")
    out = json.loads(said)
    out["gflop"] = modernbert_config.training_flops_per_sequence(modernbert_shape(args), args.mb_seq,
                                                                 predictions(data, args.mb_seq)) / 1e9
    return out


def phase_modernbert_hf(args, run: Runner, until: float) -> dict:
    return child(args, run, until, "modernbert_hf")


def phase_modernbert_jax(args, run: Runner, until: float) -> dict:
    started = time.perf_counter()
    data = data_folder(args, run, until, "modernbert_jax", args.mb_vocab, args.mb_seq)
    data_s = time.perf_counter() - started
    return {**child(args, run, until, "modernbert_jax", data), "data_s": data_s}


# -- the child processes -------------------------------------------------------------------------------------------
def modernbert_jax(args) -> dict:
    """The JAX trainer's ModernBERT step, built as bench_train_jax.py builds BERT's, on ``args.data``."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    from bench_train_jax import time_training

    from tpu_pretrain.config import Config

    with tempfile.TemporaryDirectory() as folder:
        config = Config.load(data_dir=str(args.data), output_dir=folder, backend="jax", model_family="modernbert",
                             model_size=args.mb_size, max_position_embeddings=POSITIONS,
                             train_batch_size=args.mb_batch, num_train_steps=100_000, num_warmup_steps=100,
                             steps_per_execution=args.mb_steps_per_execution)
        timed = time_training(config, args.mb_steps)
    trainer = timed["trainer"]
    return {"rate": timed["rate"], "first_s": timed["first"], "input_wait_share": timed["wait"],
            "device": trainer.devices.describe(),
            "document_masks": getattr(trainer.model, "document_separator", None) is not None}


def modernbert_hf(args) -> dict:
    """transformers' ModernBertForMaskedLM at the same shape, trained as bench_train_torch_peer.py trains BERT."""
    import torch
    import transformers
    from bench_train_torch_peer import make_optimizer, time_steps

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    if device.type == "cuda":  # as bench_train_torch_peer.py
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    config = transformers.ModernBertConfig.from_dict(modernbert_shape(args).to_hf_dict())
    config._attn_implementation = "sdpa"
    if hasattr(config, "reference_compile"):  # transformers 4.x compiled parts of the model by itself
        config.reference_compile = False
    torch.manual_seed(0)
    model = transformers.ModernBertForMaskedLM(config).to(device).train()
    optimizer, note = make_optimizer(torch, model.parameters(), device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)
    batches = []
    for _ in range(2):
        ids = torch.randint(5, args.mb_vocab, (args.mb_batch, args.mb_seq))
        labels = torch.where(torch.rand(ids.shape) < MASKED, ids, -100)
        batches.append({"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device),
                        "labels": labels.to(device)})

    timed = time_steps(torch, model, model, optimizer, autocast, batches, args.mb_steps)
    rate, first = args.mb_steps * args.mb_batch / timed["seconds"], timed["first"]
    return {"rate": rate, "first_s": first, "attention": model.config._attn_implementation, "optimizer": note,
            "precision": "bfloat16 autocast" if bf16 else "float32", "transformers": transformers.__version__,
            "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None}


# -- the table -----------------------------------------------------------------------------------------------------
def card_name(results: dict) -> str:
    """The GPU's name (nvidia-smi, else what the phases said), or "CPU"."""
    try:
        name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30).stdout.strip().splitlines()
        if name:
            return name[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    said = results.get("torch", {}).get("device") or results.get("step", {}).get("device")
    return said or "CPU"


def rows(args, results: dict) -> list[dict]:
    """The table's rows: what, sequences/s, GFLOP per sequence, first call (or compile) seconds, the phase's wall
    seconds; None where a phase failed or did not say."""

    def get(phase, *keys):
        value = results.get(phase)
        for key in keys:
            value = (value or {}).get(key)
        return value

    bert = f"BERT {args.model_size} L{args.seq} b{args.batch}"
    modern = f"ModernBERT {args.mb_size} L{args.mb_seq} b{args.mb_batch}"
    steady = get("command", "steady_steps")
    out = [("step", f"JAX step alone (bench_train_jax), {bert}", "step", get("step", "rate"),
            get("step", "first_s")),
           ("command_step", "JAX step alone on the command's data (its predictions, documents)", "command_step",
            get("command_step", "rate"), get("command_step", "first_s")),
           ("command_summary", "tpu-pretrain train: its summary's examples_per_second", "command",
            get("command", "rate"), get("command", "compiled_s") or get("command", "seconds_to_first_step")),
           ("command_steady", "tpu-pretrain train: steady from its log" + (" (steps {}-{})".format(*steady)
                                                                           if steady else ""),
            "command", get("command", "steady_rate"), None),
           ("command_last_line", "tpu-pretrain train: its last progress line", "command",
            get("command", "last_line_rate"), None),
           ("torch_eager", f"PyTorch HF BERT eager, {bert}", "torch", get("torch", "eager", "rate"),
            get("torch", "eager", "first_s")),
           ("torch_compile", "PyTorch HF BERT torch.compile", "torch", get("torch", "compile", "rate"),
            get("torch", "compile", "first_s")),
           ("modernbert_jax", f"{modern}: JAX trainer, documents apart", "modernbert_jax",
            get("modernbert_jax", "rate"), get("modernbert_jax", "first_s")),
           ("modernbert_hf", f"{modern}: transformers eager SDPA", "modernbert_hf", get("modernbert_hf", "rate"),
            get("modernbert_hf", "first_s"))]
    return [{"name": name, "what": what, "sequences_per_second": rate, "gflop_per_sequence": get(phase, "gflop"),
             "first_s": first, "wall_s": get(phase, "wall_s")} for name, what, phase, rate, first in out]


def ratios(table: list[dict]) -> list[tuple[str, float | None, str]]:
    rate = {row["name"]: row["sequences_per_second"] for row in table}

    def over(a, b):
        return rate[a] / rate[b] if rate[a] and rate[b] else None

    return [("command (steady, from its log) / step", over("command_steady", "step"), ">= 0.95"),
            ("command (summary) / step", over("command_summary", "step"), ">= 0.95"),
            ("command (summary) / the step on its data", over("command_summary", "command_step"), ">= 0.95"),
            ("step / PyTorch torch.compile", over("step", "torch_compile"), ">= 1.5"),
            ("step / PyTorch eager", over("step", "torch_eager"), ""),
            ("ModernBERT: JAX trainer / transformers eager", over("modernbert_jax", "modernbert_hf"), ">= 1.5")]


def report(args, results: dict, seconds: float) -> dict:
    card = card_name(results)
    peak = args.peak_tflops * 1e12 or published_peak(card, "bfloat16")
    table = rows(args, results)
    for row in table:
        row["mfu"] = (row["sequences_per_second"] * row["gflop_per_sequence"] * 1e9 / peak
                      if peak and row["sequences_per_second"] and row["gflop_per_sequence"] else None)
    print(f"\nbench_gpu on {card} (peak {f'{peak / 1e12:.0f} TFLOP/s bfloat16' if peak else 'unknown: no MFU'}); "
          f"{seconds:.0f} s in all" + ("; SMOKE MODE, meaningless figures" if args.smoke else ""))
    print(f"{'what':62} {'seq/s':>9} {'MFU':>6} {'first/compile s':>15} {'wall s':>7}")
    for row in table:
        rate, mfu, first, wall = (row[k] for k in ("sequences_per_second", "mfu", "first_s", "wall_s"))
        print(f"{row['what'][:62]:62} {f'{rate:.1f}' if rate else '-':>9} {f'{mfu:.1%}' if mfu else '-':>6} "
              f"{f'{first:.1f}' if first else '-':>15} {f'{wall:.0f}' if wall else '-':>7}")
    said = ratios(table)
    for what, value, goal in said:
        print(f"{what:50} {f'{value:.2f}x' if value else '-':>7}" + (f"   goal {goal}" if goal else ""))
    for name, phase in results.items():
        if "error" in phase or "skipped" in phase:
            print(f"phase {name}: {phase.get('error') or 'skipped: ' + phase['skipped']}")
    return {"card": card, "peak_tflops": peak / 1e12 if peak else None, "smoke": args.smoke, "seconds": seconds,
            "budget_s": args.budget_s, "rows": table, "ratios": {w: {"value": v, "goal": g} for w, v, g in said},
            "phases": results}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, default=None,
                        help="default: ../shared/corpora/wikitext2_valid.txt, else shared/... in the checkout "
                        "(--smoke: the built-in sample corpus)")
    parser.add_argument("--json", type=Path, default=None,
                        help="default: $OUT/bench_gpu.json if OUT is set, else ./bench_gpu.json")
    parser.add_argument("--work", type=Path, default=None, help="folder for the data and runs (default: a temp one)")
    parser.add_argument("--skip", nargs="*", default=[], choices=tuple(PHASES))
    parser.add_argument("--budget_s", type=float, default=420, help="seconds for all the phases together")
    parser.add_argument("--peak_tflops", type=float, default=0.0, help="the card's peak (default: the published)")
    parser.add_argument("--model_size", default="base")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seq", type=int, default=128, help="the command's data")
    parser.add_argument("--vocab", type=int, default=30522, help="the command's vocab (bench_train_jax.py's)")
    parser.add_argument("--step_steps", type=int, default=40)
    parser.add_argument("--steps_per_execution", type=int, default=20)
    parser.add_argument("--train_steps", type=int, default=300)
    parser.add_argument("--log_every", type=int, default=50)
    parser.add_argument("--mb_size", default="base")
    parser.add_argument("--mb_seq", type=int, default=1024)
    parser.add_argument("--mb_batch", type=int, default=32)
    parser.add_argument("--mb_vocab", type=int, default=50368)
    parser.add_argument("--mb_steps", type=int, default=10, help="timed ModernBERT steps (after two untimed calls)")
    parser.add_argument("--mb_steps_per_execution", type=int, default=5)
    parser.add_argument("--phase", choices=("modernbert_jax", "modernbert_hf"), help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = parse_args(parser, smoke={"model_size": "L2-H128", "batch": 8, "seq": 64, "vocab": 500, "step_steps": 4,
                                     "steps_per_execution": 2, "train_steps": 30, "log_every": 10,
                                     "mb_size": "tiny", "mb_seq": 64, "mb_batch": 4, "mb_vocab": 500, "mb_steps": 4,
                                     "mb_steps_per_execution": 2, "budget_s": 540},
                      what="the CPU, L2-H128 and ModernBERT tiny, length 64, batch 8 and 4, a few steps, "
                           "torch.compile's aot_eager, the built-in sample corpus")
    if args.phase:  # a child: one result line
        print("result: " + json.dumps((modernbert_jax if args.phase == "modernbert_jax" else modernbert_hf)(args)))
        return 0
    out = os.environ.get("OUT")
    args.json = args.json or (Path(out) / "bench_gpu.json" if out else
                              Path(tempfile.gettempdir()) / "bench_gpu_smoke.json" if args.smoke else
                              Path("bench_gpu.json"))
    temporary = args.work is None
    args.work = (args.work or Path(tempfile.mkdtemp(prefix="bench_gpu_"))).resolve()  # the commands run in ROOT
    args.json = args.json.resolve()
    if args.smoke and not args.corpus:
        from tpu_pretrain.data.sample_corpus import write_sample_corpus

        args.corpus = write_sample_corpus(args.work / "sample.txt", max_chars=40_000)
    shared = [folder / "shared" / "corpora" / "wikitext2_valid.txt" for folder in (ROOT.parent, ROOT)]
    args.corpus = (args.corpus or next((path for path in shared if path.is_file()), shared[0])).resolve()
    sys.argv += ["--work", str(args.work), "--corpus", str(args.corpus)]  # the children's
    run = Runner(args.work / "logs" if args.smoke else args.json.parent / "bench_gpu_logs")
    started = time.perf_counter()
    deadline, order = started + args.budget_s, [p for p in PHASES if p not in args.skip]
    results = {name: {"skipped": "--skip"} for name in args.skip}
    for i, name in enumerate(order):
        reserve = sum(PHASES[later][1] for later in order[i + 1:])
        seconds = min(PHASES[name][0], deadline - time.perf_counter() - reserve)
        if seconds < PHASES[name][1]:
            results[name] = {"skipped": f"{seconds:.0f} s of the budget left for it, under its {PHASES[name][1]} s"}
            continue
        print(f"== {name}: at most {seconds:.0f} s", flush=True)
        start = time.perf_counter()
        try:
            results[name] = globals()[f"phase_{name}"](args, run, start + seconds)
        except Exception as error:  # one phase's failure must not lose the others
            results[name] = {"error": f"{type(error).__name__}: {error}"}
            print(f"== {name} failed: {results[name]['error']}", flush=True)
        results[name].setdefault("wall_s", time.perf_counter() - start)
    summary = report(args, {name: results[name] for name in PHASES}, time.perf_counter() - started)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(f"results written to {args.json}")
    if args.smoke and temporary:
        shutil.rmtree(args.work, ignore_errors=True)
    elif not args.smoke:
        print(f"data, runs and logs in {args.work} and {run.logs}")
    return 1 if any("error" in phase for phase in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
