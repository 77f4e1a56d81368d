"""The PyTorch peer of bench_train_jax.py: Hugging Face ``BertForPreTraining`` trained on the same random data.

Usage: python benchmarks/bench_train_torch_peer.py [--model_size L12-H768] [--batch 64 256] [--steps 10]
           [--modes eager compile] [--precision auto|bfloat16|float32] [--peak_tflops 989] [--smoke]

What the JAX backend is measured against: the usual PyTorch way to pretrain BERT on one GPU. The model is built from a
config (nothing downloaded) at the size's shape (BERT-base: L12-H768, 12 heads, FFN 3072), length 128, 20 masked
positions and NSP, the feed-forward activation the package builds from scratch (``--hidden_act``: the modern recipe's
tanh GELU, as PyTorch's fused ``gelu_pytorch_tanh``), SDPA attention (``attn_implementation="sdpa"``), bfloat16
autocast, fused AdamW and global-norm clipping at 1.0 (the JAX step's), dropout 0.1 (BERT's, the JAX bench's default),
each batch size run eagerly and under ``torch.compile``. The batches are bench_train_jax.py's:
``tpu_pretrain.data.random_data.random_batch``, the MLM labels ``-100`` but at the masked positions. FLOPs per sequence
are counted by the same formula (:func:`tpu_pretrain.models.bert_config.training_flops_per_sequence`): Hugging Face's
head computes vocabulary logits at every position, and that extra work is printed but not counted, as the JAX model does
not do it.

On a CPU: float32 (bfloat16 autocast is slow on most CPUs; ``--precision bfloat16`` forces it), AdamW's fused kernel
where PyTorch has one for the device (else its foreach kernel, said so). MFU is stated against ``--peak_tflops`` or
the device's published dense peak when known, and against a large matmul measured here.
``--smoke``: L2-H128, vocab 1000, batch 4 x 32 tokens, 2 timed steps, eager and compiled with ``aot_eager`` (Dynamo
and AOTAutograd without inductor's code generation, which alone takes a minute on a CPU); seconds, meaningless
figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from support import parse_args, random_batch  # noqa: E402

from tpu_pretrain.config import Config  # noqa: E402
from tpu_pretrain.core.peaks import published_peak  # noqa: E402
from tpu_pretrain.models.bert_config import (  # noqa: E402
    BERT_ACTIVATIONS,
    bert_config_for_size,
    training_flops_per_sequence,
)

DISTINCT_BATCHES = 4  # the timed steps cycle through these, already on the device
# transformers' name for the same function where PyTorch computes it in one kernel (its gelu_new is four ops)
TORCH_ACTIVATIONS = {"gelu_new": "gelu_pytorch_tanh"}


def measured_peak(torch, device, dtype, n: int, seconds: float) -> float:
    """FLOP/s of an n x n matmul chain in ``dtype`` on ``device`` (the practical peak)."""
    a = torch.full((n, n), 0.01, dtype=dtype, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    (a @ a @ a @ a).sum().item()
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        (a @ a @ a @ a).sum()
        sync()
        runs += 1
    return 3 * 2.0 * n**3 * runs / (time.perf_counter() - start)


def torch_batches(torch, device, n: int, seq: int, pred: int, vocab: int) -> list[dict]:
    """``DISTINCT_BATCHES`` batches of BertForPreTraining's inputs from random BERT-schema arrays."""
    import numpy as np

    out = []
    for seed in range(DISTINCT_BATCHES):
        b = random_batch(n, seq, pred, vocab, seed)
        labels = np.full((n, seq), -100, np.int64)  # the MLM loss only at the masked positions
        rows = np.repeat(np.arange(n), pred)
        keep = b["masked_lm_weights"].reshape(-1) > 0
        labels[rows[keep], b["masked_lm_positions"].reshape(-1)[keep]] = b["masked_lm_ids"].reshape(-1)[keep]
        arrays = {"input_ids": b["input_ids"], "token_type_ids": b["segment_ids"], "attention_mask": b["input_mask"],
                  "labels": labels, "next_sentence_label": b["next_sentence_labels"].reshape(-1)}
        out.append({k: torch.as_tensor(np.asarray(v, np.int64)).to(device) for k, v in arrays.items()})
    return out


def make_optimizer(torch, params, device):
    """AdamW with its fused kernel where this PyTorch has one for ``device``; else foreach. (optimizer, note)."""
    kwargs = {"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-6, "weight_decay": 0.01}
    try:
        return torch.optim.AdamW(params, fused=True, **kwargs), "fused AdamW"
    except (RuntimeError, ValueError, TypeError) as error:
        note = f"foreach AdamW (fused AdamW is not available on {device.type} here: {str(error).splitlines()[0]})"
        return torch.optim.AdamW(params, foreach=True, **kwargs), note


def run(torch, args, cfg, device, precision: str, batch: int, mode: str) -> dict:
    """Build, (compile,) train ``args.steps`` timed steps; sequences/s and the first call's seconds."""
    from transformers import BertConfig, BertForPreTraining

    torch.manual_seed(0)
    config = BertConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_hidden_layers,
                        num_attention_heads=cfg.num_attention_heads, intermediate_size=cfg.intermediate_size,
                        hidden_act=TORCH_ACTIVATIONS.get(cfg.hidden_act, cfg.hidden_act),
                        max_position_embeddings=cfg.max_position_embeddings,
                        type_vocab_size=cfg.type_vocab_size, hidden_dropout_prob=args.dropout,
                        attention_probs_dropout_prob=args.dropout, initializer_range=cfg.initializer_range)
    config._attn_implementation = "sdpa"
    model = BertForPreTraining(config).to(device).train()
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    optimizer, optimizer_note = make_optimizer(torch, model.parameters(), device)
    forward = torch.compile(model, backend=args.compile_backend) if mode == "compile" else model
    batches = torch_batches(torch, device, batch, args.seq, args.pred, cfg.vocab_size)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bfloat16")
    timed = time_steps(torch, model, forward, optimizer, autocast, batches, args.steps)
    return {"rate": args.steps * batch / timed["seconds"], "first": timed["first"], "optimizer": optimizer_note,
            "losses": timed["losses"]}


def time_steps(torch, model, forward, optimizer, autocast, batches: list[dict], steps: int) -> dict:
    """Training steps as PyTorch users write them (the loss under ``autocast``, backward, clipping at 1.0, the
    optimizer's step) timed: the first call's seconds (``first``: compiling, under ``torch.compile``), then ``steps``
    steps (``seconds``) after a second, untimed one; the first and last losses."""
    def step(inputs):
        with autocast:
            loss = forward(**inputs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    start = time.perf_counter()
    first_loss = float(step(batches[0]))
    first = time.perf_counter() - start
    float(step(batches[1]))  # waits for the device
    start = time.perf_counter()
    for i in range(steps):
        loss = step(batches[i % len(batches)])
    last_loss = float(loss)  # waits for the device
    return {"first": first, "seconds": time.perf_counter() - start, "losses": (first_loss, last_loss)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model_size", default="L12-H768")
    parser.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--pred", type=int, default=20)
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run (after two untimed)")
    parser.add_argument("--modes", nargs="+", default=["eager", "compile"], choices=("eager", "compile"))
    parser.add_argument("--precision", default="auto", choices=("auto", "bfloat16", "float32"),
                        help="auto: bfloat16 autocast on a GPU that has it, float32 on a CPU")
    parser.add_argument("--dropout", type=float, default=0.1, help="hidden and attention dropout (BERT's: 0.1)")
    parser.add_argument("--hidden_act", default=Config().model.hidden_act, choices=BERT_ACTIVATIONS,
                        help="the feed-forward activation (default: the package's from scratch)")
    parser.add_argument("--compile_backend", default="inductor",
                        help="torch.compile's backend (--smoke: aot_eager, no code generation)")
    parser.add_argument("--peak_tflops", type=float, default=0.0, help="the device's peak to state MFU against")
    parser.add_argument("--matmul_size", type=int, default=0, help="0: 8192 on a GPU, 2048 on a CPU")
    parser.add_argument("--matmul_seconds", type=float, default=2.0, help="how long the peak reading runs")
    args = parse_args(parser, smoke={"model_size": "L2-H128", "batch": [4], "seq": 32, "pred": 5, "vocab": 1000,
                                     "steps": 2, "matmul_size": 512, "matmul_seconds": 0.2,
                                     "compile_backend": "aot_eager"},
                      what="L2-H128, vocab 1000, batch 4 x 32 tokens, 2 timed steps, eager and compiled with "
                           "torch.compile's aot_eager backend (inductor's code generation takes a minute on a CPU), "
                           "a 512^3 matmul reading")

    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    precision = args.precision
    if precision == "auto":
        precision = "bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    cfg = bert_config_for_size(args.model_size, args.vocab, hidden_act=args.hidden_act)
    flops = training_flops_per_sequence(cfg, args.seq, args.pred)
    head_extra = 3.0 * (args.seq - args.pred) * (2 * cfg.hidden_size**2 + 2 * cfg.hidden_size * cfg.vocab_size)
    import transformers

    print(f"device: {name}; torch {torch.__version__}, transformers {transformers.__version__}; model "
          f"{args.model_size}, length {args.seq}, {args.pred} predictions, vocab {args.vocab}, dropout {args.dropout}, "
          f"{args.hidden_act}: "
          f"{flops / 1e9:.2f} GFLOP per training sequence (Hugging Face's MLM head also does {head_extra / 1e9:.2f} "
          "GFLOP at the unmasked positions, not counted)")
    if device.type == "cpu" and args.precision == "auto":
        print("precision: float32 (bfloat16 autocast skipped on a CPU: slow without bfloat16 matmul units; "
              "--precision bfloat16 forces it)")
    else:
        print(f"precision: {precision}" + (" autocast" if precision == "bfloat16" else ""))
    size = args.matmul_size or (8192 if device.type == "cuda" else 2048)
    dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32
    measured = measured_peak(torch, device, dtype, size, args.matmul_seconds)
    peak = args.peak_tflops * 1e12 or (published_peak(name, precision) if device.type == "cuda" else None)
    print(f"a {size}^3 {precision} matmul here: {measured / 1e12:.2f} TFLOP/s; published peak: "
          + (f"{peak / 1e12:.0f} TFLOP/s" if peak else "not known for this device (give --peak_tflops)"))
    notes = set()
    for batch in args.batch:
        for mode in args.modes:
            torch._dynamo.reset()
            try:
                out = run(torch, args, cfg, device, precision, batch, mode)
            except torch.cuda.OutOfMemoryError:
                print(f"{mode:7s} batch {batch:4d}: out of device memory")
                torch.cuda.empty_cache()
                continue
            notes.add(out["optimizer"])
            rate = out["rate"]
            line = (f"{mode:7s} batch {batch:4d}: {rate:.1f} sequences/s ({rate * flops / 1e12:.2f} TFLOP/s); "
                    f"first call {out['first']:.1f} s; MFU vs the matmul {rate * flops / measured:.1%}")
            if peak:
                line += f", vs the peak {rate * flops / peak:.1%}"
            print(line + f"; loss {out['losses'][0]:.2f} -> {out['losses'][1]:.2f}", flush=True)
    for note in sorted(notes):
        print(f"optimizer: {note}")
    if "compile" in args.modes:
        print(f"torch.compile backend: {args.compile_backend}")


if __name__ == "__main__":
    main()
