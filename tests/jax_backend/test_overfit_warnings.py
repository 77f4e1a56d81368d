"""A run that says when it wastes its time, through the command line (issue 44's small-corpus case, scaled down):
27 training sequences read 89 times. The start says how many passes that is; the evaluations come often enough to
see the held-out loss turn (``eval_every_steps`` left to the resolver); the end names the best step, the kept
checkpoint to use, and a perplexity worse than a uniform guess."""

from __future__ import annotations

import re
import subprocess
import sys

from fault_injection import ENV, sample_data


def test_a_run_that_overfits_says_so_at_the_start_and_names_the_step_to_keep_at_the_end(tmp_path):
    data_dir = sample_data(tmp_path / "small", max_chars=12_000, num_shards=1, recipe="modern", eval_fraction=0.3)
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "tpu_pretrain", "train", "--backend", "jax", "--data_dir", data_dir,
                           "--output_dir", str(run), "--model_size", "L2-H128", "--train_batch_size", "8",
                           "--num_train_steps", "300", "--learning_rate", "1e-3", "--num_warmup_steps", "20",
                           "--save_checkpoints_steps", "50", "--session_hours", "-1"],
                          env=ENV, capture_output=True, text=True, timeout=600)
    said = " ".join(done.stderr.split())
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"reads the \d+ training sequences in \S+ [\d.]+ times: on this little data the held-out loss "
                     r"will likely stop falling and turn up", said), said[-3000:]
    assert "eval_every_steps=50: 6 evaluations over num_train_steps=300 (about ten, 50 to 1,000 steps apart" in said
    evals = [int(step) for step in re.findall(r"Eval at step (\d+) ", said)]
    assert evals == [0, 50, 100, 150, 200, 250], evals
    turned = re.search(r"Held-out loss rose from [\d.]+ at step (\d+) to [\d.]+ at step 300: the model overfit its "
                       r"training data after that\. The kept checkpoint nearest it is step (\d+): tpu-pretrain "
                       rf"evaluate {re.escape(str(run))} --checkpoint \2", said)
    assert turned and 0 < int(turned[1]) < 300, said[-3000:]
    assert (run / "checkpoints" / f"ckpt-{int(turned[2]):09d}").is_dir()
    assert re.search(r"Held-out perplexity [\d.]+ is above the vocab's 1,500 tokens", said), said[-3000:]
