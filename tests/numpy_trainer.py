"""A trainer of the run core's protocol in NumPy alone, for the loop's tests that need no framework.

It is a real, small model: a weight vector fitted by momentum SGD on inputs drawn from (seed, step) at the rate
the core's schedule gives, so its weights after N steps depend on each of the N steps having run once and in
order, as a backend's do. Its state is saved with the JAX backend's NumPy-only :class:`JaxState`
(``state.npz``), so checkpoints are written, verified, pruned, mirrored and restored for real.
"""

from __future__ import annotations

import numpy as np

from tpu_pretrain.config import Config
from tpu_pretrain.core.protocol import Finished
from tpu_pretrain.core.resolve import RunPlan
from tpu_pretrain.jax_backend.state import JaxState


class NumpyTrainer:
    def __init__(self, config: Config, width: int = 32_768, at_step: dict | None = None):
        """``at_step``: step -> a function called once that step has run (what the world does meanwhile)."""
        self.plan = RunPlan.resolve(config)
        self.at_step = at_step or {}
        t = self.plan.config.train
        self.seed, self.log_ids = t.train_seed, t.log_example_ids
        self.steps_per_execution = t.steps_per_execution or 1
        self.example_ids: list[tuple[int, list[int]]] = []
        self.is_chief = True
        rng = np.random.default_rng(self.seed)
        self.arrays = {"params/w": rng.normal(size=width).astype(np.float32),
                       "m/w": np.zeros(width, np.float32), "step": np.zeros((), np.int64)}
        self.schedule = self.plan.schedule

    @property
    def step(self) -> int:
        return int(self.arrays["step"])

    def use_schedule(self, schedule) -> None:
        self.schedule = schedule

    def start_input(self, step: int) -> None:
        assert step == self.step

    def dispatch(self, steps: int) -> Finished:
        return Finished(self.train_steps(steps), steps)

    def train_steps(self, steps: int) -> dict:
        w, m = self.arrays["params/w"], self.arrays["m/w"]
        for _ in range(steps):
            x = np.random.default_rng([self.seed, self.step]).normal(size=w.shape).astype(np.float32)
            m = np.float32(0.9) * m + np.float32(w @ x / w.size) * x
            w = w - np.float32(self.schedule.rate(self.step)) * m
            self.arrays["step"] = np.asarray(self.step + 1, np.int64)
            if self.log_ids:
                self.example_ids.append((self.step, [self.step]))
            if self.step in self.at_step:
                self.at_step[self.step]()
        self.arrays.update({"params/w": w, "m/w": m})
        loss = float(np.mean(w * w))
        return {"loss": loss, "mlm_loss": loss, "mlm_accuracy": 0.0}

    def evaluate(self) -> dict | None:
        return None

    def checkpoint_state(self) -> JaxState:
        return JaxState(lambda: dict(self.arrays), self.arrays.update,
                        lambda: {name: value.shape for name, value in self.arrays.items()})

    def weights_finite(self) -> bool:
        return all(bool(np.isfinite(v).all()) for v in self.arrays.values())

    def any_worker(self, flag: bool) -> bool:
        return flag

    def describe(self) -> str:
        return "NumPy (the loop's test trainer)"

    @property
    def precision(self) -> str:
        return "float32"

    @property
    def peak_flops(self) -> float | None:
        return None

    def close(self) -> None:
        pass
