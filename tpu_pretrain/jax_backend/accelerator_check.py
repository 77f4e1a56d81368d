"""``tpu-pretrain tpu-check --backend jax``: what the JAX backend does on this accelerator, measured before a run.

The check runs in a child process (``python -m tpu_pretrain.jax_backend.accelerator_check``), so the notebook
kernel never holds the TPU: JAX's devices, then the real trainer on random tokens at the model size and batch
the run will use: the first step (compilation) timed, then ``steps`` steps timed for sequences/s and MFU (against
the chip's published peak where it is known), then a checkpoint saved, the weights changed by a step, and
restored. Random tokens suffice: the speed of a step does not depend on the text.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

SEQ, PRED, VOCAB = 128, 20, 30522  # BERT's phase-1 shape: what the free-TPU runs train
RESULT = "result.json"


def check_accelerator(model_size: str, batch: int, steps: int, save: str = "", timeout: float = 1800.0) -> int:
    """Run the check in a child process, its lines streamed; print the verdict (and save it to ``save``); 0 when
    training works."""
    from ..child_process import stream

    with tempfile.TemporaryDirectory(prefix="accelerator-check-") as folder:
        command = [sys.executable, "-m", __name__, folder, "--model_size", model_size, "--batch", str(batch),
                   "--steps", str(steps)]
        started = time.monotonic()
        status, _ = stream(command, echo=lambda line: print("  " + line, end="", flush=True), timeout=timeout)
        seconds = time.monotonic() - started
        result_file = Path(folder, RESULT)
        result = json.loads(result_file.read_text()) if result_file.is_file() else {}
    if status != 0 or not result.get("restored"):
        reason = result.get("error") or ended(status, seconds, timeout)
        print(failure(reason, model_size, batch), flush=True)
        return 1
    print(verdict(result), flush=True)
    if save:
        from .. import storage

        storage.write_text(save, json.dumps(result, indent=2) + "\n")
        print(f"Saved to {save}.", flush=True)
    return 0


def ended(status: int, seconds: float, timeout: float) -> str:
    """Why a check that wrote no result ended: past ``--timeout``, killed (SIGKILL: the out-of-memory killer, as a
    rule), or its exit status."""
    if status == -9 and timeout and seconds >= timeout - 1:
        return f"the check ran past --timeout {timeout:.0f} s and was stopped (raise --timeout to give it longer)"
    if status in (-9, 137):
        return (f"the check was killed (SIGKILL) after {seconds:.0f} s before reporting: most likely by the "
                "out-of-memory killer, which ends a process that outgrows this machine's memory")
    return f"the check ended with status {status} before reporting"


def failure(reason: str, model_size: str, batch: int) -> str:
    """The failed check's line; a model and batch that do not fit the device say what to change."""
    line = f"Accelerator check FAILED: {reason}"
    if re.search(r"RESOURCE_EXHAUSTED|out[ -]of[ -]memory", reason, re.IGNORECASE):
        fit = "most likely does not fit this machine's memory" if "(SIGKILL)" in reason else \
            "does not fit this device's memory"
        line += (f" -- {model_size} at batch {batch} {fit}: pass a smaller --model_size "
                 "(e.g. L2-H128) or --train_batch_size (on a CPU: the check only proves the path works), or find what "
                 "fits a TPU first with `tpu-pretrain plan`.")
    return line


def verdict(r: dict) -> str:
    where = (f"Accelerator check passed on {r['device_kind']}" if r["kind"] != "cpu"
             else "Accelerator check: no TPU or GPU here, the steps ran on the CPU")
    mfu = (f", MFU {r['mfu']:.0%} of the {r['peak_tflops']:.0f} TFLOP/s {r['precision']} peak" if r.get("mfu")
           else " (MFU: this device's peak is not known)")
    return (f"{where} ({r['devices']}): {r['model_size']} at {SEQ} tokens, batch {r['batch']}: "
            f"{r['sequences_per_second']:,.1f} sequences/s{mfu}; first step (compiling) {r['compile_seconds']:.0f} s; "
            "checkpoint saved and restored.")


def measure(folder: Path, model_size: str, batch: int, steps: int) -> dict:
    """Train on random tokens with the real trainer; what it did, as a dict."""
    import numpy as np

    from ..config import Config
    from ..core.checkpoints import CheckpointManager
    from ..core.run_folder import RunFolder
    from ..data.random_data import write_random_data_folder
    from ..models.bert_config import bert_config_for_size, training_flops_per_sequence
    from .trainer import JaxTrainer

    data = write_random_data_folder(folder / "data", batch * (steps + 3), SEQ, PRED, VOCAB)
    config = Config.load(data_dir=data.data_dir, output_dir=str(folder / "run"), backend="jax",
                         model_size=model_size, train_batch_size=batch, num_train_steps=1000, num_warmup_steps=10)
    trainer = JaxTrainer(config)
    print(f"JAX devices: {trainer.devices.describe()}", flush=True)
    start = time.perf_counter()
    trainer.train_steps(1)
    compile_seconds = time.perf_counter() - start
    start = time.perf_counter()
    loss = trainer.train_steps(steps)["loss"]
    rate = steps * batch / (time.perf_counter() - start)
    print(f"{steps} steps of {batch} x {SEQ} tokens: {rate:.1f} sequences/s, loss {loss:.3f}", flush=True)
    manager = CheckpointManager(RunFolder(folder / "run").checkpoints, trainer.checkpoint_state(), keep_max=1)
    manager.save(trainer.step)
    expected = trainer.stored_weights()
    trainer.train_steps(1)
    manager.restore_latest()
    restored = all(np.array_equal(w, expected[n]) for n, w in trainer.stored_weights().items())
    trainer.close()
    flops = training_flops_per_sequence(bert_config_for_size(model_size, VOCAB), SEQ, PRED)
    first = trainer.devices.devices[0]
    result = {"kind": trainer.devices.kind, "device_kind": getattr(first, "device_kind", "?"),
              "devices": trainer.devices.describe(), "precision": trainer.devices.precision,
              "model_size": model_size, "batch": batch, "steps": steps, "compile_seconds": compile_seconds,
              "sequences_per_second": rate, "tflops": rate * flops / 1e12, "loss": float(loss),
              "restored": bool(restored and np.isfinite(loss))}
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("--model_size", default="L12-H768")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    try:
        result = measure(folder, args.model_size, args.batch, args.steps)
        status = 0
    except Exception as exc:  # reported to the parent, which gives the verdict
        result = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
        print(f"check failed: {result['error']}", flush=True)
        status = 1
    (folder / RESULT).write_text(json.dumps(result))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
