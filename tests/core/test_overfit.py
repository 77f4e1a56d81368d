"""A run that says when it wastes its time (issue 44, item 2): passes over the data at the start, the held-out loss's
turn (the step to keep) and a perplexity worse than a uniform guess at the end."""

import logging
from types import SimpleNamespace

from tpu_pretrain.core.overfit import (
    HeldOutWatch,
    auto_eval_every_steps,
    passes_warning,
    perplexity_note,
    turn_warning,
)


def test_many_passes_over_little_data_are_said_at_the_start():
    # The case: 1,839 training sequences, 1,000 steps x 32, eval every 1,000 steps.
    said = passes_warning(1000, 32, 1839, 1000, "run/data")
    assert said.startswith("num_train_steps=1000 x train_batch_size=32 reads the 1,839 training sequences in "
                           "run/data 17.4 times: on this little data the held-out loss will likely stop falling and "
                           "turn up (overfitting)")
    assert "about 229 steps (4 passes)" in said and "--eval_every_steps 100 evaluates often enough" in said
    assert "--eval_every_steps" not in passes_warning(1000, 32, 1839, 100)  # already often enough, as -1 makes it
    assert passes_warning(1000, 32, 100_000, 1000) == ""  # a third of a pass
    assert passes_warning(1000, 32, None, 1000) == ""  # unknown


def test_the_automatic_eval_cadence_sees_a_short_run_turn_and_costs_a_long_one_little():
    assert [auto_eval_every_steps(n) for n in (12, 400, 1000, 30_000, 1_000_000)] == [50, 50, 100, 1000, 1000]


def test_a_turned_held_out_loss_names_the_step_to_keep():
    evaluations = [(0, 7.91), (120, 6.9), (360, 6.43), (600, 7.2), (1000, 7.94)]
    said = turn_warning(evaluations, [360, 800, 1000], "run")
    assert said == ("Held-out loss rose from 6.4300 at step 360 to 7.9400 at step 1000: the model overfit its "
                    "training data after that. The step to keep: tpu-pretrain evaluate run --checkpoint 360 (and "
                    "export --checkpoint 360).")
    assert "the kept checkpoint nearest it is step 800" in turn_warning(evaluations, [800, 1000], "run").lower()
    assert "No checkpoint near it is kept" in turn_warning(evaluations, [], "run")
    assert turn_warning([(0, 7.9), (500, 6.0), (1000, 6.01)], [1000], "run") == ""  # a wobble, not a turn
    assert turn_warning([(0, 7.9), (1000, 5.0)], [1000], "run") == ""  # still falling


def test_a_perplexity_above_the_vocab_is_called_what_it_is():
    note = perplexity_note(2815.78, 2682)
    assert note.startswith("perplexity 2815.78 is above the vocab's 2,682 tokens: the model predicts the masked "
                           "tokens worse than a uniform guess among them (loss 7.8943)")
    assert perplexity_note(300.0, 2682) == ""


def test_the_watch_warns_once_at_the_last_step(caplog):
    watch = HeldOutWatch(1000, 2682, "run", lambda: [360, 1000])
    with caplog.at_level(logging.WARNING, logger="tpu_pretrain"):
        for step, loss in ((0, 7.91), (360, 6.43), (1000, 7.94)):
            watch.seen(step, {"mlm_loss": loss, "mlm_perplexity": 2815.78 if step == 1000 else 100.0})
        watch.seen(1000, {"mlm_loss": 7.94, "mlm_perplexity": 2815.78})  # the cadence's and the final eval
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert "--checkpoint 360" in warnings[0] and warnings[1].startswith("Held-out perplexity 2815.78 is above")


def test_the_watch_starts_from_a_trainer(caplog):
    plan = SimpleNamespace(config=SimpleNamespace(train=SimpleNamespace(num_train_steps=1000, train_batch_size=32,
                                                                        eval_every_steps=1000),
                                                  storage=SimpleNamespace(output_dir="run")),
                           data=SimpleNamespace(train_instances=1839, data_dir="run/data"), vocab=["x"] * 2682,
                           model_config=SimpleNamespace(vocab_size=2682))
    manager = SimpleNamespace(local_checkpoints=lambda: [SimpleNamespace(step=1000), SimpleNamespace(step=360)])
    with caplog.at_level(logging.WARNING, logger="tpu_pretrain"):
        watch = HeldOutWatch.start(SimpleNamespace(plan=plan), manager)
    assert "17.4 times" in caplog.text and watch.vocab_size == 2682 and watch.kept_steps() == [360, 1000]
