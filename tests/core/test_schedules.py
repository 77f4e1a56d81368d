"""The learning-rate schedules as pure functions, and their re-planning when a run resumes with other settings:
the rate continues from the one reached, never jumps, and ends where the new settings say."""

import dataclasses

import numpy as np
import pytest

from tpu_pretrain.config import Config
from tpu_pretrain.core import schedules
from tpu_pretrain.core.resolve import auto_warmup_steps
from tpu_pretrain.core.schedules import Schedule, cooldown_start, planned, resume
from tpu_pretrain.errors import UserInputError


def plan(**settings) -> Schedule:
    """BERT's linear decay (the classic recipe's) unless a test asks for another schedule."""
    return planned(Config.load(learning_rate=1.0, **{"recipe": "classic", **settings}).train)


def rates(schedule: Schedule, steps) -> list[float]:
    return [round(schedule.rate(s), 4) for s in steps]


def test_bert_linear_and_warmup_stable_decay_shapes():
    assert rates(plan(num_train_steps=100, num_warmup_steps=10), (0, 5, 10, 55, 100, 120)) == [
        0.0, 0.5, 0.9, 0.45, 0.0, 0.0]
    wsd = plan(num_train_steps=100, num_warmup_steps=10, lr_schedule="wsd")
    assert wsd.decay_start == 80
    assert rates(wsd, (0, 5, 10, 50, 80, 90, 100, 120)) == [0.0, 0.5, 1.0, 1.0, 1.0, 0.5, 0.0, 0.0]
    assert cooldown_start(100, 0, 10) == 80 and cooldown_start(100, 30, 10) == 70 and cooldown_start(100, 95, 10) == 10
    assert auto_warmup_steps(5000) == 500 and auto_warmup_steps(1_000_000) == 10_000


def test_the_same_settings_continue_the_recorded_schedule_exactly():
    replanned = dataclasses.replace(plan(num_train_steps=100, num_warmup_steps=10), decay_start=60, decay_from=0.3)
    wanted = plan(num_train_steps=100, num_warmup_steps=10)
    schedule, change = resume(wanted, replanned.record(wanted), 70, 0)
    assert schedule == replanned and change is None


def check_continuous(before: Schedule, after: Schedule, step: int, end: float, total: int) -> None:
    assert after.rate(step) == pytest.approx(before.rate(step), rel=1e-6)
    assert after.rate(total) == pytest.approx(end, rel=1e-6, abs=1e-12)
    later = np.array([after.rate(s) for s in range(step, total + 1)])
    assert np.all(np.abs(np.diff(later)) <= 1.0001 * abs(later[0] - end) / max(1, total - step) + 1e-9)


def test_more_steps_mid_decay_decay_on_from_the_rate_reached():
    """The issue's case: a 100k-step run stopped at 60k and resumed with 200k went 4.0e-5 -> 7.0e-5."""
    before = planned(Config.load(learning_rate=1e-4, num_train_steps=100_000, num_warmup_steps=10_000,
                                 recipe="classic").train)
    wanted = planned(Config.load(learning_rate=1e-4, num_train_steps=200_000, num_warmup_steps=10_000,
                                 recipe="classic").train)
    assert before.rate(60_000) == pytest.approx(4.0e-5) and wanted.rate(60_000) == pytest.approx(7.0e-5)
    after, change = resume(wanted, before.record(before), 60_000, 0)
    assert "num_train_steps 100000 -> 200000" in change and "4e-05" in change
    check_continuous(before, after, 60_000, 0.0, 200_000)
    assert after.rate(130_000) == pytest.approx(2.0e-5)  # halfway from 60k to 200k


def test_fewer_steps_and_another_end_rate_also_stay_continuous():
    before = plan(num_train_steps=100, num_warmup_steps=10)
    after, _ = resume(plan(num_train_steps=80, num_warmup_steps=10, end_learning_rate=0.1), before.record(before),
                      50, 0)
    check_continuous(before, after, 50, 0.1, 80)


def test_a_longer_warmup_goes_on_from_the_rate_reached():
    before = plan(num_train_steps=100, num_warmup_steps=10)
    after, change = resume(plan(num_train_steps=100, num_warmup_steps=20), before.record(before), 5, 0)
    assert "num_warmup_steps 10 -> 20" in change
    assert after.rate(5) == pytest.approx(0.5) and after.rate(20) == pytest.approx(0.8)  # BERT's line from there on
    assert after.rate(12.5) == pytest.approx(0.5 + 0.5 * 7.5 / 15)


def test_wsd_cool_down_placed_on_resume():
    stable = plan(num_train_steps=1000, num_warmup_steps=10, lr_schedule="wsd")
    # stopping earlier than planned: the cool-down starts at the resumed step
    shorter, change = resume(plan(num_train_steps=130, num_warmup_steps=10, lr_schedule="wsd"),
                             stable.record(stable), 120, 0)
    assert "re-planned at step 120" in change and shorter.decay_start == 120
    assert shorter.rate(120) == 1.0 and shorter.rate(125) == pytest.approx(0.5)
    # during the cool-down, a later end: it decays on from the rate reached
    wanted = plan(num_train_steps=130, num_warmup_steps=10, lr_schedule="wsd")
    longer, _ = resume(plan(num_train_steps=150, num_warmup_steps=10, lr_schedule="wsd"), shorter.record(wanted),
                       125, 0)
    assert longer.rate(125) == pytest.approx(0.5) and longer.rate(150) == 0.0 and longer.rate(140) == pytest.approx(0.2)
    # still in the stable phase, with a new end: the new plan's cool-down, nothing to re-place
    later, _ = resume(plan(num_train_steps=2000, num_warmup_steps=10, lr_schedule="wsd"), stable.record(stable), 500, 0)
    assert later.decay_start == 1600 and later.rate(500) == 1.0


def test_a_finished_run_extended_says_so_and_rewarms_on_request():
    done = plan(num_train_steps=100, num_warmup_steps=10)
    wanted = plan(num_train_steps=200, num_warmup_steps=10)
    with pytest.raises(UserInputError, match=r"decayed to 0 by step 100.*--rewarm_steps N"):
        resume(wanted, done.record(done), 100, 0)
    after, change = resume(wanted, done.record(done), 100, 20)
    assert after.rate(100) == 0.0 and after.rate(110) == pytest.approx(0.5) and after.rate(120) == pytest.approx(1.0)
    assert after.rate(160) == pytest.approx(0.5) and after.rate(200) == 0.0 and "warmup" in change


def test_a_finished_wsd_run_extended_under_a_cool_down_is_not_trained_at_zero():
    """--num_train_steps 30 --num_cooldown_steps 30 on a wsd run finished at step 20 (issue 24, item 8)."""
    done = plan(num_train_steps=20, num_warmup_steps=2, lr_schedule="wsd")
    wanted = plan(num_train_steps=30, num_warmup_steps=2, lr_schedule="wsd", num_cooldown_steps=30)
    with pytest.raises(UserInputError, match=r"decayed to 0 by step 20 \(num_train_steps 20 -> 30, cool-down start "
                                             r"16 -> 2\): going on would train at about zero\. Add --rewarm_steps"):
        resume(wanted, done.record(done), 20, 0)
    after, _ = resume(wanted, done.record(done), 20, 4)
    assert after.rate(24) == 1.0 and after.rate(27) == pytest.approx(0.5) and after.rate(30) == 0.0


def test_schedules_recorded_by_earlier_versions_are_read():
    wanted = plan(num_train_steps=100, num_warmup_steps=10)
    tf_keras_linear = {"learning_rate": 1.0, "num_train_steps": 100, "num_warmup_steps": 10, "power": 1.0,
                       "end_learning_rate": 0.0}
    first_jax = {"name": "linear", "num_warmup_steps": 10, "num_train_steps": 100}
    for recorded in (tf_keras_linear, first_jax):
        assert resume(wanted, recorded, 50, 0) == (wanted, None)
    tf_keras_wsd = {**tf_keras_linear, "decay_start": 60, "decay_from": 0.8}
    old = schedules.from_record(tf_keras_wsd, wanted)
    assert old.kind == "wsd" and old.rate(80) == pytest.approx(0.4)
