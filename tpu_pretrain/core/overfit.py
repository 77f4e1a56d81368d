"""Whether a run spends its time well: the passes over the training data its settings imply (said at the start),
the held-out loss's turn and a perplexity worse than a uniform guess (said at the end). Pure functions and one
small watcher that :class:`.run_session.RunSession` feeds with its evaluations; nothing here changes training."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

log = logging.getLogger(__name__)

PASSES_WARNED = 4.0  # more passes than this over the same sequences: a small corpus, and an overfit to come
ROSE_BY = 0.02  # a held-out loss this much (and 1%) above its best has turned, not wobbled


def auto_eval_every_steps(num_train_steps: int) -> int:
    """``eval_every_steps`` -1: about ten evaluations over the run, every 50 to 1,000 steps (a short run sees its
    held-out loss turn; a long one spends little of its time evaluating)."""
    return min(1000, max(50, num_train_steps // 10))


def passes_over_data(num_train_steps: int, train_batch_size: int, train_instances: int | None) -> float | None:
    """How many times the run reads its training sequences (steps x batch / sequences); None where unknown."""
    if not train_instances or num_train_steps <= 0:
        return None
    return num_train_steps * train_batch_size / train_instances


def passes_warning(num_train_steps: int, train_batch_size: int, train_instances: int | None,
                   eval_every_steps: int, data_dir: str = "") -> str:
    """The start's warning where the settings imply many passes over the data (empty otherwise)."""
    passes = passes_over_data(num_train_steps, train_batch_size, train_instances)
    if passes is None or passes <= PASSES_WARNED:
        return ""
    where = f" in {data_dir}" if data_dir else ""
    cadence = auto_eval_every_steps(num_train_steps)
    see = ("" if 0 < eval_every_steps <= cadence else
           f"; --eval_every_steps {cadence} evaluates often enough to see the turn")
    return (f"num_train_steps={num_train_steps} x train_batch_size={train_batch_size} reads the {train_instances:,} "
            f"training sequences{where} {passes:.1f} times: on this little data the held-out loss will likely stop "
            f"falling and turn up (overfitting) well before the end. More text, or about "
            f"{max(1, int(num_train_steps * PASSES_WARNED / passes)):,} steps (4 passes), spends the time better{see}; "
            "the end of the run names the step with the best held-out loss.")


def perplexity_note(perplexity: float, vocab_size: int | None) -> str:
    """What a held-out perplexity above the vocab's size is: worse than a uniform guess (empty otherwise)."""
    if not vocab_size or not perplexity or perplexity <= vocab_size:
        return ""
    return (f"perplexity {perplexity:.2f} is above the vocab's {vocab_size:,} tokens: the model predicts the masked "
            f"tokens worse than a uniform guess among them (loss {math.log(vocab_size):.4f}), as an overfit or "
            "untrained model does")


def turn_warning(evaluations: list[tuple[int, float]], kept_steps: list[int], output_dir: str) -> str:
    """The end's warning where the last held-out loss rose from its best (empty otherwise): the best step, and the
    kept checkpoint nearest it to evaluate or export (``--checkpoint``)."""
    if len(evaluations) < 2:
        return ""
    best_step, best = min(evaluations, key=lambda e: (e[1], e[0]))
    last_step, last = evaluations[-1]
    if last_step <= best_step or last - best <= max(ROSE_BY, 0.01 * best):
        return ""
    text = (f"Held-out loss rose from {best:.4f} at step {best_step} to {last:.4f} at step {last_step}: the model "
            "overfit its training data after that.")
    if not kept_steps:
        return text + " No checkpoint near it is kept (save_checkpoints_steps, keep_checkpoint_max)."
    keep = min(kept_steps, key=lambda s: (abs(s - best_step), s))
    near = "the step to keep" if keep == best_step else f"the kept checkpoint nearest it is step {keep}"
    return (f"{text} {near[0].upper()}{near[1:]}: tpu-pretrain evaluate {output_dir} --checkpoint {keep} (and "
            f"export --checkpoint {keep}).")


class HeldOutWatch:
    """A session's held-out losses; at the run's last step, the end's warnings (once)."""

    def __init__(self, num_train_steps: int, vocab_size: int | None, output_dir: str,
                 kept_steps: Callable[[], list[int]]):
        self.num_train_steps, self.vocab_size, self.output_dir = num_train_steps, vocab_size, output_dir
        self.kept_steps = kept_steps
        self.evaluations: list[tuple[int, float]] = []
        self.said = False

    @classmethod
    def start(cls, trainer, manager) -> HeldOutWatch:
        """Said at the start: the passes the settings imply. The watcher for the session's evaluations."""
        plan = trainer.plan
        t = plan.config.train
        warning = passes_warning(t.num_train_steps, t.train_batch_size, plan.data.train_instances,
                                 t.eval_every_steps, plan.data.data_dir)
        if warning:
            log.warning("%s", warning)
        vocab_size = len(plan.vocab) if plan.vocab else plan.model_config.vocab_size
        return cls(t.num_train_steps, vocab_size, plan.config.storage.output_dir,
                   lambda: sorted(c.step for c in manager.local_checkpoints()))

    def seen(self, step: int, evaluation: dict) -> None:
        loss = evaluation.get("mlm_loss")
        if loss is None or not math.isfinite(loss):
            return
        if not self.evaluations or self.evaluations[-1][0] != step:
            self.evaluations.append((step, float(loss)))
        if step < self.num_train_steps or self.said:
            return
        self.said = True
        turn = turn_warning(self.evaluations, self.kept_steps(), self.output_dir)
        if turn:
            log.warning("%s", turn)
        note = perplexity_note(evaluation.get("mlm_perplexity", 0.0), self.vocab_size)
        if note:
            log.warning("Held-out %s.", note)
