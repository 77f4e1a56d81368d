"""``tpu-pretrain tpu-check``: does training work on this TPU? One line of verdict, the diagnosis when not.

The probe runs in a child process (``python -m tpu_pretrain.tf_backend.tpu_probe``): it initialises the TPU system,
reports its type, chips and cores, runs two training steps of a tiny BERT through the real trainer, saves a
checkpoint, changes the weights with a third step, restores the checkpoint and compares, then exits, so the TPU
is released when the check ends. The parent never imports TensorFlow: when the child aborts, hangs or fails,
it still gives the verdict and the diagnosis (:mod:`.setup.tpu_diagnosis`). ``--cpu`` runs the same
steps on two logical CPU devices (without XLA) where no TPU exists, which is how CI exercises this path.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from ..child_process import stream
from ..environment import installed_version
from ..runtime import tpu_vm_present
from .setup.tpu_diagnosis import diagnose, explain

RESULT = "result.json"
VOCAB, SEQ, PRED = 128, 32, 5
TINY_BERT = {"vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
             "intermediate_size": 128, "max_position_embeddings": SEQ}


def check_tpu(cpu: bool = False, timeout: float = 900.0) -> int:
    """Run the probe in a child process, print its output, then the verdict; 0 when training works."""
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="tpu-check-") as folder:
        command = [sys.executable, "-m", "tpu_pretrain.tf_backend.tpu_probe", folder] + (["--cpu"] if cpu else [])
        status, tail = stream(command, echo=lambda line: print("  " + line, end="", flush=True), timeout=timeout)
        result_file = Path(folder, RESULT)
        result = json.loads(result_file.read_text()) if result_file.is_file() else {}
    seconds = time.time() - started
    if status == 0 and result.get("restored"):
        print(verdict(result, seconds), flush=True)
        return 0
    reason = result.get("error") or (f"the probe timed out after {timeout:.0f} s" if status == -9 else
                                     f"the probe ended with status {status} before reporting")
    findings = diagnose(tail)
    print(f"TPU check FAILED: {explain(findings) if findings else reason}\n  (probe: {reason})", flush=True)
    return 1


def verdict(result: dict, seconds: float) -> str:
    losses = ", ".join(f"{loss:.3f}" for loss in result["losses"])
    place = (f"TPU check passed: {result['hardware']}, {result['replicas']} replica(s)" if result["kind"] == "tpu"
             else f"TPU check: no TPU here; the probe's steps passed on the CPU ({result['replicas']} replica(s))")
    return (f"{place}; tensorflow-tpu {result['tensorflow_tpu'] or 'not installed'} "
            f"(TensorFlow {result['tensorflow']}), libtpu {result['libtpu'] or 'not installed'}; "
            f"2 training steps of a tiny BERT in {result['precision']} "
            f"(loss {losses}); checkpoint saved and restored; {seconds:.0f} s.")


def probe(folder: Path, cpu: bool) -> dict:
    """Connect, train two steps, save, perturb, restore and compare; what happened, as a dict."""
    import numpy as np

    from .framework import tf

    if cpu:
        device = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(device, [tf.config.LogicalDeviceConfiguration()] * 2)
    from ..config import Config
    from ..core.checkpoints import CheckpointManager
    from ..core.run_folder import RunFolder
    from ..data.random_data import write_random_data_folder
    from .accelerator import detect_accelerator
    from .trainer import Trainer

    accelerator = detect_accelerator("cpu" if cpu else "tpu")  # XLA on a TPU; the TPU build has none for the CPU
    print(f"accelerator: {accelerator.describe()}", flush=True)
    (folder / "bert_config.json").write_text(json.dumps(TINY_BERT))
    data = write_random_data_folder(folder / "data", 3 * 8 * accelerator.num_replicas, SEQ, PRED, VOCAB)
    config = Config.load(data_dir=data.data_dir,
                         output_dir=str(folder / "run"), bert_config_file=str(folder / "bert_config.json"),
                         train_batch_size=8 * accelerator.num_replicas, num_train_steps=3, num_warmup_steps=0,
                         learning_rate=1e-3, steps_per_execution=1, hidden_dropout_prob=0.0)
    trainer = Trainer(config, accelerator)
    losses = [trainer.train_steps(1)["loss"] for _ in range(2)]
    print(f"two training steps: loss {losses[0]:.4f}, {losses[1]:.4f}", flush=True)
    manager = CheckpointManager(RunFolder(folder / "run").checkpoints, trainer.checkpoint_state(), keep_max=1)
    saved = manager.save(trainer.step)
    expected = [w.numpy() for w in trainer.model.weights]
    trainer.train_steps(1)
    restored = manager.restore_latest()
    same = all(np.array_equal(w.numpy(), e) for w, e in zip(trainer.model.weights, expected, strict=True))
    print(f"checkpoint {saved.name}: saved, weights changed by a third step, restored "
          f"{'identical' if same else 'DIFFERENT'} at step {trainer.step}", flush=True)
    if not (same and restored is not None and trainer.step == 2 and all(np.isfinite(losses))):
        raise RuntimeError(f"the checkpoint did not restore the saved state (step {trainer.step}, weights "
                           f"{'equal' if same else 'different'}, losses {losses})")
    return {"kind": accelerator.kind, "hardware": accelerator.hardware, "replicas": accelerator.num_replicas,
            "precision": accelerator.precision, "losses": losses, "restored": True, "tensorflow": tf.__version__}


def main(argv: list[str]) -> int:
    folder, cpu = Path(argv[0]), "--cpu" in argv[1:]
    result = {"tensorflow_tpu": installed_version("tensorflow-tpu"), "libtpu": installed_version("libtpu"),
              "tpu_vm": tpu_vm_present()}
    try:
        result.update(probe(folder, cpu))
        status = 0
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        print(f"probe failed: {result['error']}", flush=True)  # its first line: the parent gives the diagnosis
        status = 1
    (folder / RESULT).write_text(json.dumps(result))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
