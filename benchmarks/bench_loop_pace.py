"""The training command's steady rate beside its own step's, on a model small enough that host time shows.

Usage: python benchmarks/bench_loop_pace.py [--model_size L2-H128] [--batch 32] [--steps 200 600]
           [--steps_per_execution 20] [--log_every_steps 50] [--smoke]

What the loop costs around the compiled step (:func:`tpu_pretrain.core.loop.run_training`: reading each call's
figures, logging, the bar, the guard, the cadence), measured where it would show: a tiny model (L2-H128) whose step
takes milliseconds. On the same random data and settings, (1) the step alone: the trainer's own calls dispatched back
to back (``JaxTrainer.train_steps``), and (2) runs of the loop of each ``--steps`` length through ``train()``, whose
summary reports the steady rate. Printed: each run's summary rate against the step's (the loop should cost under
10%), and the shortest run's against the longest's (the figure a user is told should not depend on the run's
length: within 15%). The step is timed before the runs and after, against their mean: on a shared machine one
reading alone has been 15% off the other. ``--smoke``: 16 and 32 steps of batch 4 (seconds; meaningless figures).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("KERAS_BACKEND", "jax")

from support import parse_args, write_random_data_folder  # noqa: E402

from tpu_pretrain.config import Config  # noqa: E402


def settings(args, folder: str, output_dir: str, steps: int) -> Config:
    return Config.load(data_dir=folder, output_dir=output_dir, model_size=args.model_size, backend="jax",
                       train_batch_size=args.batch, num_train_steps=steps, num_warmup_steps=min(10, steps // 4),
                       steps_per_execution=args.steps_per_execution, log_every_steps=args.log_every_steps,
                       save_checkpoints_steps=steps, eval_every_steps=0, max_eval_steps=1, session_hours=-1)


def step_rate(args, folder: str) -> float:
    """Sequences/s of the trainer's calls alone, dispatched back to back after two warm-up calls."""
    from bench_train_jax import time_training

    steps = max(args.steps) // args.steps_per_execution * args.steps_per_execution
    return time_training(settings(args, folder, os.path.join(folder, "step"), 100_000), steps)["rate"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model_size", default="L2-H128")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, nargs="+", default=[200, 600], help="the loop's run lengths")
    parser.add_argument("--steps_per_execution", type=int, default=20)
    parser.add_argument("--log_every_steps", type=int, default=50)
    args = parse_args(parser, smoke={"batch": 4, "seq": 32, "steps": [16, 32], "steps_per_execution": 4,
                                     "log_every_steps": 6},
                      what="L2-H128, batch 4 x 32 tokens, runs of 16 and 32 steps")
    from tpu_pretrain.training import train

    with tempfile.TemporaryDirectory() as folder:
        write_random_data_folder(folder, max(512, args.batch * 8), args.seq, max(1, args.seq * 15 // 100), 1000,
                                 eval_n=args.batch)
        before = step_rate(args, folder)
        runs = {}
        for steps in args.steps:
            result = train(settings(args, folder, os.path.join(folder, f"run{steps}"), steps), progress=False)
            runs[steps] = result
        after = step_rate(args, folder)  # a machine whose speed drifted over the runs shows it here
    step = (before + after) / 2
    print(f"model {args.model_size}, batch {args.batch} x {args.seq} tokens, {args.steps_per_execution} steps per "
          f"call, log every {args.log_every_steps} (calls cut at each log line)")
    print(f"the step alone (calls back to back): {step:.1f} sequences/s ({before:.1f} before the runs, {after:.1f} "
          "after)")
    for steps, result in runs.items():
        rate = result.examples_per_second
        print(f"train, {steps} steps: {rate:.1f} sequences/s steady ({rate / step:.1%} of the step; aim >= 90%), "
              f"compiled in {result.compile_seconds:.1f} s")
    short, long = runs[min(runs)].examples_per_second, runs[max(runs)].examples_per_second
    if long:
        print(f"the {min(runs)}-step run's rate is {short / long:.1%} of the {max(runs)}-step run's (aim: within 15%)")


if __name__ == "__main__":
    main()
