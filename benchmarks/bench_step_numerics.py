"""The training step's loss, gradients and updates on this machine's accelerator against the CPU's in float32, from
the same weights and batches: a fast step that computes the wrong thing would still be timed.

Usage: python benchmarks/bench_step_numerics.py [--model_family bert|modernbert] [--model_size L12-H768] [--batch 8]
           [--seq 128] [--pred 20] [--json FILE] [--smoke]

Each platform-specific form of the JAX step (on a GPU: cuDNN's attention, the Pallas LayerNorm kernels, the weights'
bfloat16 copies carried through a call, the bias sums widened by their bits, the token table gathered in float32, the
logits as wide as their GEMM...) is checked against its generic form by the tests, on the CPU where it can run there;
the assembled step runs only on the accelerator. Here one batch's loss and every weight's gradient are computed by
:func:`tpu_pretrain.jax_backend.step.gradients` (what the trainer's calls run, with the copies they carry) three
ways, from the candidate's weights:

- ``candidate``: the trainer as this machine picks it (its accelerator and precision; ``--precision`` to choose),
- ``cpu_bfloat16``: the CPU in mixed bfloat16: the error bfloat16 itself brings, the baseline,
- ``reference``: the CPU in float32,

on two batches: rows whole (the step benchmark's), and rows padded with documents kept apart (the command's data:
each row cut by [SEP]s into documents that attend within themselves). Then ``two_steps``: each weight's change over
two steps of the trainer's own call (:func:`tpu_pretrain.jax_backend.step.train_chunk`: the clipping, AdamW and, on a
GPU, the bfloat16 copies the first step's update writes for the second), at a learning rate that moves the weights
by about half their initial spread. A weight's error is ``|g - g_ref| / |g_ref|`` (its gradient's, or its change's).
Verdict ``ok`` where the candidate's loss is within 1% of the reference's and its error, over all weights and for
each, is at most 4x cpu_bfloat16's or 5% (a wrong form's error is of the order of 1: a second step reading stale
copies puts the changes ~40% off); else ``WRONG`` and exit 1.
``--smoke``: L2-H128, batch 4 x 32 tokens, the candidate the CPU in bfloat16 (seconds; it checks the script).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("KERAS_BACKEND", "jax")

from support import parse_args  # noqa: E402

from tpu_pretrain.config import Config  # noqa: E402
from tpu_pretrain.data.random_data import random_batch, write_random_data_folder  # noqa: E402

LOSS_TOLERANCE = 0.01  # the candidate's loss against the reference's, relative
# the two steps' learning rate, no warm-up: the first step moves the weights by about half their initial spread, so a
# second step that read weights other than the first one's update (its copies, say) could not come out the same
STEP_LEARNING_RATE = 1e-2
ERROR_FACTOR, ERROR_FLOOR = 4.0, 0.05  # a gradient's error: at most ERROR_FACTOR x bfloat16's on the CPU, or the floor


def trainers(args, folder: str) -> dict:
    """The three JAX trainers of one random data folder, the CPU's with the candidate's weights."""
    from tpu_pretrain.jax_backend.trainer import JaxTrainer

    write_random_data_folder(folder, args.batch * 4, args.seq, args.pred, args.vocab, no_nsp=mlm_only(args))

    def settings(**kw) -> Config:
        return Config.load(data_dir=folder, output_dir=folder, model_family=args.model_family,
                           model_size=args.model_size, backend="jax",
                           train_batch_size=args.batch, num_train_steps=1000, hidden_dropout_prob=0.0,
                           num_warmup_steps=0, learning_rate=STEP_LEARNING_RATE, **kw)

    made = {"candidate": JaxTrainer(settings(mixed_precision=args.precision)),
            "cpu_bfloat16": JaxTrainer(settings(accelerator="cpu", mixed_precision="bfloat16")),
            "reference": JaxTrainer(settings(accelerator="cpu", mixed_precision="float32"))}
    weights = made["candidate"].stored_weights()
    for name in ("cpu_bfloat16", "reference"):
        made[name].load_stored_weights(weights, "the candidate's weights", strict=True)
    return made


def mlm_only(args) -> bool:
    """ModernBERT trains on MLM-only data."""
    return args.model_family != "bert"


def rows(args, seed: int) -> dict:
    """A batch of random rows, whole, in the trainer's dtypes."""
    from tpu_pretrain.jax_backend.input import to_model_dtypes

    return to_model_dtypes(random_batch(args.batch, args.seq, args.pred, args.vocab, seed, mlm_only(args)))


def batches(args, separator: int) -> dict:
    """The rows whole, and the same rows padded (by up to a quarter of their length) with three [SEP]s at random
    places in what is left; the masked positions past a row's end point at 0 with weight 0, as the data's do."""
    whole = rows(args, seed=5)
    apart = {k: v.copy() for k, v in whole.items()}
    rng = np.random.default_rng(6)
    for row in range(args.batch):
        length = int(rng.integers(args.seq * 3 // 4, args.seq + 1))
        apart["input_ids"][row, length:] = 0
        apart["segment_ids"][row, length:] = 0
        apart["input_ids"][row, rng.choice(np.arange(2, length - 1), 3, replace=False)] = separator
        past = apart["masked_lm_positions"][row] >= length
        apart["masked_lm_positions"][row, past] = 0
        apart["masked_lm_weights"][row, past] = 0.0
    return {"whole": (whole, None), "documents_apart": (apart, separator)}


def loss_and_gradients(trainer, batch: dict, separator: int | None) -> tuple[float, list[np.ndarray], float | None]:
    """One global batch's loss and each weight's gradient in float32 (unscaled), as the trainer's step computes
    them; float16's loss scale halved until the gradients are finite, as the step's would be (the scale used)."""
    import jax
    import jax.numpy as jnp

    from tpu_pretrain.core import metrics
    from tpu_pretrain.jax_backend import step
    from tpu_pretrain.jax_backend.devices import fetch
    from tpu_pretrain.jax_backend.input import BATCH_FEATURES

    trainer.model.document_separator = separator  # read when the step is traced, below
    spec = trainer.spec
    placed = jax.device_put({k: batch[k] for k in BATCH_FEATURES}, trainer.devices.split())
    state = step.with_copies(spec, trainer.state, placed)
    computed = jax.jit(functools.partial(step.gradients, spec), **trainer.devices.jit_options())
    for _ in range(24):
        grads, stats, _ = fetch(computed(state, placed))
        scale = state.get(step.LOSS_SCALE, {}).get("scale")
        if scale is None or all(np.isfinite(g).all() for g in grads):
            break
        state = {**state, step.LOSS_SCALE: {**state[step.LOSS_SCALE], "scale": jnp.float32(scale / 2)}}
    weight = max(float(batch["masked_lm_weights"].sum()), 1.0)
    loss = float(metrics.global_batch_loss(stats, weight, float(batch["input_ids"].shape[0]), spec.with_nsp))
    return loss, [np.asarray(g, np.float32) for g in grads], None if scale is None else float(scale)


def two_steps(trainer, batches: list[dict], scale: float | None = None) -> tuple[float, list[np.ndarray], float | None]:
    """Each weight's change over two steps of the trainer's own call (:func:`..step.train_chunk`, as the trainer
    compiles it, without donating the state): the clipping, the optimizer's update and, on a GPU, the bfloat16 copies
    the first step's update writes and the second step reads; and the two steps' mean MLM loss. ``scale``: float16's
    loss scale to start from (one found finite on the first batch: a step that overflowed would not update)."""
    import jax
    import jax.numpy as jnp

    from tpu_pretrain.core import metrics
    from tpu_pretrain.jax_backend import step
    from tpu_pretrain.jax_backend.devices import fetch
    from tpu_pretrain.jax_backend.input import BATCH_FEATURES

    trainer.model.document_separator = None
    stacked = {k: np.stack([b[k] for b in batches]) for k in BATCH_FEATURES}
    placed = jax.device_put(stacked, trainer.devices.split(axis=1))
    call = jax.jit(functools.partial(step.train_chunk, trainer.spec), **trainer.devices.jit_options())
    state = trainer.state
    if scale is not None and step.LOSS_SCALE in state:
        state = {**state, step.LOSS_SCALE: {**state[step.LOSS_SCALE], "scale": jnp.float32(scale)}}
    state, sums = call(state, placed)
    before, after = fetch(trainer.state["params"]), fetch(state["params"])
    scale = state.get(step.LOSS_SCALE, {}).get("scale")
    return (metrics.metrics_from_sums(fetch(sums))["mlm_loss"],
            [np.asarray(a, np.float32) - np.asarray(b, np.float32) for a, b in zip(after, before, strict=True)],
            None if scale is None else float(fetch(scale)))


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm((got - want).ravel()) / max(np.linalg.norm(want.ravel()), 1e-30))


def compared(names: list[str], results: dict, what: str = "gradients") -> dict:
    """The candidate's and cpu_bfloat16's errors against the reference (``results[who]``: a loss, an array per weight,
    the loss scale): the loss's, over all weights, per weight; and the verdict (the module's docstring)."""
    ref_loss, ref = results["reference"][:2]
    out = {"what": what, "loss": {k: r[0] for k, r in results.items()}, "loss_scale": results["candidate"][2]}
    flat_ref = np.concatenate([g.ravel() for g in ref])
    wrong = []
    for who in ("candidate", "cpu_bfloat16"):
        grads = results[who][1]
        out[who] = {"loss_error": abs(results[who][0] - ref_loss) / max(abs(ref_loss), 1e-30),
                    "overall": relative_error(np.concatenate([g.ravel() for g in grads]), flat_ref),
                    "weights": {n: relative_error(g, r) for n, g, r in zip(names, grads, ref, strict=True)}}
    cand, base = out["candidate"], out["cpu_bfloat16"]
    if not cand["loss_error"] <= LOSS_TOLERANCE:
        wrong.append(f"loss {cand['loss_error']:.2%} off")
    if not cand["overall"] <= max(ERROR_FACTOR * base["overall"], ERROR_FLOOR):
        wrong.append(f"{what} {cand['overall']:.2%} off overall")
    wrong += [f"{n} {e:.2%} off" for n, e in cand["weights"].items()
              if not e <= max(ERROR_FACTOR * base["weights"][n], ERROR_FLOOR)]
    out["wrong"] = wrong
    return out


def show(case: str, found: dict, top: int = 6) -> None:
    cand, base = found["candidate"], found["cpu_bfloat16"]
    losses = ", ".join(f"{k} {v:.5f}" for k, v in found["loss"].items())
    print(f"{case}: loss {losses}; {found['what']} off the reference overall: candidate {cand['overall']:.3%}, "
          f"cpu_bfloat16 {base['overall']:.3%}" + (f" (float16 loss scale {found['loss_scale']:g})"
                                                   if found["loss_scale"] else ""))
    worst = sorted(cand["weights"], key=lambda n: -cand["weights"][n] / max(base["weights"][n], 1e-12))[:top]
    for n in worst:
        print(f"  {n:60} candidate {cand['weights'][n]:8.3%}  cpu_bfloat16 {base['weights'][n]:8.3%}")
    print(f"  {case}: " + ("ok" if not found["wrong"] else "WRONG: " + "; ".join(found["wrong"][:8])), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model_family", default="bert", choices=("bert", "modernbert"))
    parser.add_argument("--model_size", default="L12-H768", help="(ModernBERT: base, L4-H256...)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--pred", type=int, default=20)
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--precision", default="auto", help="the candidate's mixed_precision (auto: the machine's)")
    parser.add_argument("--json", help="write the figures here")
    args = parse_args(parser, smoke={"model_size": "L2-H128", "batch": 4, "seq": 32, "pred": 5, "vocab": 1000,
                                     "precision": "bfloat16"},
                      what="L2-H128, batch 4 x 32 tokens, the candidate the CPU in bfloat16")
    from tpu_pretrain.jax_backend.input import separator_id

    with tempfile.TemporaryDirectory() as folder:
        made = trainers(args, folder)
        candidate = made["candidate"]
        print(f"candidate: {candidate.describe()}", flush=True)
        report = {"candidate": candidate.describe(), "cases": {}}
        cases = batches(args, separator_id(candidate.model_config, candidate.vocab))
        scales = {}
        for case, (batch, separator) in cases.items():
            results = {name: loss_and_gradients(t, batch, separator) for name, t in made.items()}
            scales = scales or {name: r[2] for name, r in results.items()}  # found finite on the first step's batch
            report["cases"][case] = compared(candidate.names, results)
            show(case, report["cases"][case])
        steps = [cases["whole"][0], rows(args, seed=7)]
        report["cases"]["two_steps"] = compared(
            candidate.names, {n: two_steps(t, steps, scales[n]) for n, t in made.items()}, "updates")
        show("two_steps", report["cases"]["two_steps"])
        for t in made.values():
            t.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    sys.exit(1 if any(c["wrong"] for c in report["cases"].values()) else 0)


if __name__ == "__main__":
    main()
