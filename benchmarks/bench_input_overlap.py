"""Input overlap of the JAX backend: steps/s, and the share of the time the devices waited on input, with the
input read ahead by the trainer's background thread and without it, in the same run.

Usage: python benchmarks/bench_input_overlap.py [--model_size L2-H128] [--batch 16] [--seq 64]
           [--steps_per_execution 2] [--chunks_per_call 2] [--calls 4] [--repeats 2] [--slow_input 0.5,2]
           [--corpus FILE] [--smoke]

Runs without TensorFlow. The shards are real: vocab and create-data on ``../shared/corpora/wikitext2_valid.txt``
(``--corpus``; the built-in sample corpus where that is absent). The baseline is the same code with the queue
depth 0 (``JaxTrainer.prefetch_chunks = 0``): each call's batches are pulled and placed only after the devices
finished the call before, as before the overlap. Both modes start from the same weights, alternating,
``--repeats`` times. The wait share is ``train_steps``' own figure (``input_wait_seconds`` over the time of the
calls: time blocked on input with the devices idle). Also printed: the host time to pull and place one call's
batches alone, and the compute time of a call (the serial run's time less its wait).

On a CPU the input is fast beside any BERT step (about 30 us a record against milliseconds), so the serial
wait is small there and its cores are shared by the input's threads and the computation. ``--slow_input F``
also runs with every batch delayed by F times the measured step time (a sleep: storage with latency, such as
a mounted Drive or a bucket), to show both regimes: input faster than the step (F < 1: hidden, the wait near
zero) and slower (F > 1: the devices wait about 1 - 1/F of the time however far ahead it reads).
``--smoke``: a tiny run, to check that it works.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("KERAS_BACKEND", "jax")

from tpu_pretrain.config import Config  # noqa: E402

CORPUS = ROOT.parent / "shared" / "corpora" / "wikitext2_valid.txt"


def make_data(folder: Path, corpus: str, seq: int, pred: int, vocab_size: int, max_chars: int) -> str:
    """vocab.txt and BERT-schema shards made by the project's own vocab and create-data steps."""
    from tpu_pretrain.data.create import create_pretraining_data
    from tpu_pretrain.data.sample_corpus import write_sample_corpus
    from tpu_pretrain.data.vocab import build_vocab

    if not corpus or not os.path.isfile(corpus):
        corpus = str(write_sample_corpus(folder / "corpus.txt", max_chars=max_chars))
    vocab = build_vocab(Config.load(input=[corpus], vocab_size=vocab_size, output_dir=str(folder)))
    create_pretraining_data(Config.load(input=[corpus], vocab_file=vocab.path, output_dir=str(folder / "data"),
                                        max_seq_length=seq, max_predictions_per_seq=pred, dupe_factor=2, num_shards=4,
                                        eval_fraction=0.0, workers=0))
    return str(folder / "data")


def host_seconds_per_call(trainer, steps: int, calls: int) -> float:
    """Seconds to pull and place one call's batches with nothing else running: the work the thread hides."""
    import jax

    trainer.close()
    trainer.prefetch_chunks = 0
    prefetch = trainer._prefetcher()  # depth 0: what the serial baseline does, and the thread otherwise
    prefetch.take(steps)  # the input's own threads start
    start = time.perf_counter()
    for _ in range(calls):
        jax.block_until_ready([b for _, b in prefetch.take(steps)])
    seconds = (time.perf_counter() - start) / calls
    trainer.close()
    return seconds


def slowed(source, delay: float):
    """``source``'s batches, each ``delay`` seconds late (storage latency; a sleep, so no CPU is taken)."""
    for item in source:
        time.sleep(delay)
        yield item


def run_mode(trainer, start: dict, depth: int, steps: int, calls: int, delay: float = 0.0) -> dict:
    """Train ``calls`` calls of ``steps`` steps from ``start`` with the queue ``depth`` (in calls of
    steps_per_execution); steps/s and the wait share over them (a first call, untimed, compiles and warms)."""
    from tpu_pretrain.jax_backend.input import TrainingBatches

    t, d = trainer.config.train, trainer.config.data
    trainer.close()
    trainer.checkpoint_state().put(start)
    trainer.prefetch_chunks = depth
    source = TrainingBatches(trainer.data.train_files, t.train_batch_size, d.max_seq_length,
                             d.max_predictions_per_seq, seed=t.train_seed)
    trainer.train_batches = slowed(source, delay) if delay else source  # read ahead by the trainer's prefetcher
    trainer.train_steps(steps)
    waited, begin = 0.0, time.perf_counter()
    for _ in range(calls):
        waited += trainer.train_steps(steps)["input_wait_seconds"]
    seconds = time.perf_counter() - begin
    trainer.close()
    source.close()
    trainer.train_batches = None
    return {"steps_per_second": steps * calls / seconds, "wait_share": waited / seconds, "seconds": seconds,
            "wait": waited}


def compare(trainer, start: dict, args, label: str, delay: float = 0.0) -> list[tuple[dict, dict]]:
    """Read ahead against serial, alternating, ``--repeats`` times; prints each pair."""
    from tpu_pretrain.jax_backend.trainer import JaxTrainer

    depth, steps = JaxTrainer.prefetch_chunks, args.steps_per_execution * args.chunks_per_call
    pairs = []
    print(label)
    for i in range(args.repeats):
        ahead = run_mode(trainer, start, depth, steps, args.calls, delay)
        serial = run_mode(trainer, start, 0, steps, args.calls, delay)
        pairs.append((ahead, serial))
        print(f"  run {i + 1}: read ahead ({depth} calls deep): {ahead['steps_per_second']:.2f} steps/s, input wait "
              f"{ahead['wait_share']:.1%} | serial: {serial['steps_per_second']:.2f} steps/s, input wait "
              f"{serial['wait_share']:.1%} | speed-up {ahead['steps_per_second'] / serial['steps_per_second']:.2f}x")
    return pairs


def bench(args, data_dir: str) -> None:
    from tpu_pretrain.jax_backend.trainer import JaxTrainer

    config = Config.load(data_dir=data_dir, output_dir=tempfile.mkdtemp(), model_size=args.model_size,
                         backend="jax", train_batch_size=args.batch, num_train_steps=1_000_000, num_warmup_steps=10,
                         steps_per_execution=args.steps_per_execution)
    trainer = JaxTrainer(config)
    start = trainer.checkpoint_state().get()
    steps = args.steps_per_execution * args.chunks_per_call
    print(f"{args.model_size}, batch {args.batch}, length {args.seq}: {trainer.describe()}; calls of {steps} steps "
          f"({args.chunks_per_call} x steps_per_execution {args.steps_per_execution}), {args.calls} timed calls a run")
    pairs = compare(trainer, start, args, "input as read from the shards:")
    compute = statistics.median((serial["seconds"] - serial["wait"]) / args.calls for _, serial in pairs)
    host = host_seconds_per_call(trainer, steps, args.calls)
    print(f"  per call: input pulled and placed {host * 1e3:.1f} ms on the host alone; compute {compute * 1e3:.0f} ms "
          f"(input/compute {host / compute:.3f})")
    for factor in [float(f) for f in args.slow_input.split(",") if f.strip()]:
        delay = factor * compute / steps
        compare(trainer, start, args, f"input slowed to {factor:g}x the step time ({delay * 1e3:.0f} ms a batch):",
                delay)
    trainer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model_size", default="L2-H128")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--pred", type=int, default=10)
    parser.add_argument("--steps_per_execution", type=int, default=2)
    parser.add_argument("--chunks_per_call", type=int, default=2, help="compiled calls per train_steps")
    parser.add_argument("--calls", type=int, default=4, help="timed train_steps calls per mode and repeat")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--slow_input", default="0.5,2", help="also with each batch delayed by these x step time")
    parser.add_argument("--corpus", default=str(CORPUS), help="text for create-data (absent: the sample corpus)")
    parser.add_argument("--vocab_size", type=int, default=4000)
    parser.add_argument("--smoke", action="store_true", help="a tiny model and a few steps: seconds, not minutes")
    args = parser.parse_args()
    if args.smoke:
        args.model_size, args.batch, args.seq, args.pred, args.vocab_size = "L2-H128", 8, 32, 5, 600
        args.steps_per_execution, args.chunks_per_call, args.calls, args.repeats = 2, 1, 2, 1
        args.slow_input, args.corpus = "2", ""
        print("smoke mode (a tiny model, two calls, once): its figures are meaningless", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        begin = time.perf_counter()
        data_dir = make_data(Path(folder), args.corpus, args.seq, args.pred, args.vocab_size,
                             max_chars=20_000 if args.smoke else 400_000)
        print(f"data: {args.corpus or 'the sample corpus'} -> shards of length {args.seq} in "
              f"{time.perf_counter() - begin:.1f} s", flush=True)
        bench(args, data_dir)


if __name__ == "__main__":
    main()
