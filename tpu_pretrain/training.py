"""The pretraining loop: ``train(config)`` and the ``Trainer`` behind it.

A custom loop rather than ``model.fit``: it needs an explicit step counter (resume from a checkpoint
must restart at an exact step and data position), losses normalised over the *global* batch (so 1 or
N replicas, and k accumulated micro-batches, give the same update), several steps per compiled call
(TPU), and hooks between calls where a checkpoint manager can plug in (``Trainer.callbacks``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import tensorflow as tf

from .accelerator import Accelerator, detect_accelerator, set_precision_policy
from .checkpoints import CheckpointManager
from .config import Config
from .errors import UserInputError
from .input_pipeline import DataInfo, MaskingSpec, distributed_dataset, read_data_info
from .model import BertConfig, build_pretraining_model, load_init_checkpoint, resolve_bert_config
from .optimization import create_optimizer
from .run_folder import check_can_resume, record_identity, run_identity
from .session import SessionGuard, session_deadline

log = logging.getLogger(__name__)
SUM = tf.distribute.ReduceOp.SUM
STAT_KEYS = ("mlm_loss_sum", "mlm_weight", "mlm_correct", "nsp_loss_sum", "nsp_correct", "examples")


def metrics_from_sums(sums: dict) -> dict:
    """Means from summed statistics: MLM loss/accuracy over masked tokens, NSP over examples."""
    s = {k: float(v) for k, v in sums.items()}
    out = {"mlm_loss": s["mlm_loss_sum"] / max(s["mlm_weight"], 1e-9),
           "mlm_accuracy": s["mlm_correct"] / max(s["mlm_weight"], 1e-9)}
    out["mlm_perplexity"] = math.exp(min(out["mlm_loss"], 50.0))
    out["loss"] = out["mlm_loss"]
    if s["nsp_loss_sum"] or s["nsp_correct"]:
        out["nsp_loss"] = s["nsp_loss_sum"] / max(s["examples"], 1e-9)
        out["nsp_accuracy"] = s["nsp_correct"] / max(s["examples"], 1e-9)
        out["loss"] += out["nsp_loss"]
    return out


@dataclass
class TrainResult:
    """What a run did: steps, the loss curve, eval figures before and after, and throughput."""

    output_dir: str
    steps: int
    history: list[dict] = field(default_factory=list)
    initial_eval: dict | None = None
    final_eval: dict | None = None
    examples_per_second: float = 0.0
    seconds_to_first_step: float = 0.0
    stopped_reason: str | None = None  # set when training stopped early (deadline, SIGTERM) to resume later

    def summary(self) -> str:
        parts = [f"Trained to step {self.steps} in {self.output_dir}"]
        if self.history:
            parts.append(f"last train loss {self.history[-1]['loss']:.4f}")
        if self.final_eval:
            e = self.final_eval
            parts.append(f"eval MLM accuracy {e['mlm_accuracy']:.4f}, loss {e['mlm_loss']:.4f}")
            if "nsp_accuracy" in e:
                parts.append(f"NSP accuracy {e['nsp_accuracy']:.4f}")
        parts.append(f"{self.examples_per_second:.1f} examples/s")
        return "; ".join(parts)


class Trainer:
    """Builds model, optimizer and input for a configuration, and runs training steps and evaluations."""

    def __init__(self, config: Config, accelerator: Accelerator | None = None):
        self.config = config
        t, m = config.train, config.model
        self.data: DataInfo = read_data_info(config.storage.data_dir)
        self._resolve_data_settings()
        self.accelerator = accelerator or detect_accelerator(
            t.accelerator, precision=t.mixed_precision, jit_compile=t.jit_compile, tpu_name=t.tpu_name)
        self.strategy = self.accelerator.strategy
        replicas = self.accelerator.num_replicas
        k = t.gradient_accumulation_steps
        if t.train_batch_size % (replicas * k):
            raise UserInputError(
                f"train_batch_size={t.train_batch_size} must be a multiple of replicas ({replicas}) x "
                f"gradient_accumulation_steps ({k}) = {replicas * k}.")
        self.with_nsp = not config.data.no_nsp
        self.bert_config: BertConfig = resolve_bert_config(
            model_size=m.model_size, bert_config_file=m.bert_config_file, init_checkpoint=m.init_checkpoint,
            vocab_size=self.vocab_size, max_position_embeddings=m.max_position_embeddings,
            hidden_dropout_prob=m.hidden_dropout_prob)
        self.steps_per_execution = t.steps_per_execution or self.accelerator.default_steps_per_execution()
        self.callbacks: list[Callable[[Trainer, int], None]] = []
        self.example_ids: list[tuple[int, list[int]]] = []
        self._build()

    # -- setup ------------------------------------------------------------------------------------
    def _resolve_data_settings(self) -> None:
        d, info = self.config.data, self.data
        for key, value in (("max_seq_length", info.max_seq_length),
                           ("max_predictions_per_seq", info.max_predictions_per_seq)):
            if self.config.get(key) != value:
                log.info("Using the data's %s=%s (configuration had %s).", key, value, self.config.get(key))
                self.config.set(key, value)
        if info.settings.get("no_nsp") and not d.no_nsp:
            d.no_nsp = True
        vocab_size = info.vocab_size
        if d.vocab_file:
            if not os.path.isfile(d.vocab_file):
                raise UserInputError(f"vocab_file {d.vocab_file} does not exist.")
            with open(d.vocab_file, encoding="utf-8") as handle:
                file_size = sum(1 for _ in handle)
            if vocab_size and vocab_size != file_size:
                raise UserInputError(f"vocab_file {d.vocab_file} has {file_size} tokens but the data in "
                                     f"{info.data_dir} was made with {vocab_size}; use the data's vocab.")
            vocab_size = file_size
        self.vocab_size = vocab_size

    def _masking_spec(self) -> MaskingSpec | None:
        if not self.config.train.dynamic_masking:
            return None
        vocab = self.config.data.vocab_file or os.path.join(self.data.data_dir, "vocab.txt")
        if not os.path.isfile(vocab):
            raise UserInputError("dynamic_masking needs the vocab: set vocab_file.")
        return MaskingSpec.from_vocab_file(vocab, self.config.data.masked_lm_prob)

    def _build(self) -> None:
        t, replicas = self.config.train, self.accelerator.num_replicas
        tf.keras.utils.set_random_seed(t.train_seed)
        set_precision_policy(self.accelerator)
        with self.strategy.scope():
            self.pretraining = build_pretraining_model(self.bert_config, self.config.data.max_seq_length,
                                                       self.config.data.max_predictions_per_seq, self.with_nsp)
            self.model = self.pretraining.model
            if self.config.model.init_checkpoint:
                self.init_report = load_init_checkpoint(self.pretraining, self.config.model.init_checkpoint)
            optimizer = create_optimizer(
                optimizer=t.optimizer, learning_rate=t.learning_rate, num_train_steps=t.num_train_steps,
                num_warmup_steps=t.num_warmup_steps, weight_decay_rate=t.weight_decay_rate,
                beta_1=t.adam_beta1, beta_2=t.adam_beta2, epsilon=t.adam_epsilon, clip_norm=t.clip_norm,
                lr_decay_power=t.lr_decay_power, end_learning_rate=t.end_learning_rate,
                variables=self.model.trainable_variables,
                jit_compile=self.accelerator.jit_compile and self.accelerator.kind != "tpu")
            if self.accelerator.precision == "float16":
                optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
            self.optimizer = optimizer
            getattr(optimizer, "inner_optimizer", optimizer).build(self.model.trainable_variables)
        common = dict(max_seq_length=self.config.data.max_seq_length,
                      max_predictions_per_seq=self.config.data.max_predictions_per_seq, seed=t.train_seed)
        self.train_dataset = self.train_iterator = None  # opened at the (restored) step by start_input()
        self.eval_batch_size = self._eval_batch_size()
        self.eval_dataset = None
        if self.eval_batch_size:
            per_pipeline = t.max_eval_steps * replicas // max(1, self._input_pipelines())
            self.eval_dataset = distributed_dataset(self.strategy, self.data.eval_files, self.eval_batch_size,
                                                    training=False, max_batches=per_pipeline, **common)
        self._grads_fn = tf.function(self._compute_gradients, jit_compile=self.accelerator.jit_compile
                                     and self.accelerator.kind != "tpu")
        self._train_loop = tf.function(self._train_loop_fn)
        self._eval_loop = tf.function(self._eval_loop_fn)

    def start_input(self, step: int) -> None:
        """Open the training input at ``step``: the order is a pure function of (seed, records consumed)."""
        t = self.config.train
        self.train_dataset = distributed_dataset(
            self.strategy, self.data.train_files, t.train_batch_size, training=True,
            max_seq_length=self.config.data.max_seq_length,
            max_predictions_per_seq=self.config.data.max_predictions_per_seq, seed=t.train_seed,
            shuffle_buffer_size=t.shuffle_buffer_size, masking=self._masking_spec(),
            start_record=step * t.train_batch_size, records_per_epoch=self.data.train_instances)
        self.train_iterator = iter(self.train_dataset)

    def _input_pipelines(self) -> int:
        resolver = getattr(self.strategy, "cluster_resolver", None)
        return getattr(self.strategy.extended, "_num_workers", 1) if resolver else 1

    def _eval_batch_size(self) -> int:
        if not self.data.eval_files:
            return 0
        replicas = self.accelerator.num_replicas
        size = self.config.train.eval_batch_size or self.config.train.train_batch_size
        if self.data.eval_instances is not None:
            size = min(size, self.data.eval_instances)
        size -= size % replicas
        if not size:
            log.warning("Too few eval instances (%s) for %s replicas: evaluation is skipped.",
                        self.data.eval_instances, replicas)
        return size

    # -- compiled steps ----------------------------------------------------------------------------
    def _forward_stats(self, batch, global_weight, global_examples, training: bool):
        inputs = [batch["input_ids"], batch["segment_ids"], batch["masked_lm_positions"]]
        outputs = self.model(inputs, training=training)
        outputs = outputs if isinstance(outputs, list | tuple) else [outputs]
        labels, weights = batch["masked_lm_ids"], batch["masked_lm_weights"]
        logits = tf.cast(outputs[0], tf.float32)
        ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        predicted = tf.argmax(logits, axis=-1, output_type=tf.int32)
        stats = {"mlm_loss_sum": tf.reduce_sum(ce * weights), "mlm_weight": tf.reduce_sum(weights),
                 "mlm_correct": tf.reduce_sum(weights * tf.cast(tf.equal(predicted, labels), tf.float32)),
                 "examples": tf.cast(tf.shape(labels)[0], tf.float32)}
        loss = stats["mlm_loss_sum"] / global_weight
        if self.with_nsp:
            nsp_logits = tf.cast(outputs[1], tf.float32)
            nsp_labels = batch["next_sentence_labels"]
            nsp_ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=nsp_labels, logits=nsp_logits)
            nsp_pred = tf.argmax(nsp_logits, axis=-1, output_type=tf.int32)
            stats["nsp_loss_sum"] = tf.reduce_sum(nsp_ce)
            stats["nsp_correct"] = tf.reduce_sum(tf.cast(tf.equal(nsp_pred, nsp_labels), tf.float32))
            loss += stats["nsp_loss_sum"] / global_examples
        else:
            stats["nsp_loss_sum"] = stats["nsp_correct"] = tf.constant(0.0)
        return loss, stats

    def _compute_gradients(self, batch, global_weight, global_examples):
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            loss, stats = self._forward_stats(batch, global_weight, global_examples, training=True)
            scaled = self.optimizer.get_scaled_loss(loss) if self.accelerator.precision == "float16" else loss
        return tape.gradient(scaled, variables), stats

    def _replica_step(self, batch):
        """One optimizer step on this replica's share, split into micro-batches if accumulating."""
        context = tf.distribute.get_replica_context()
        global_weight = context.all_reduce(SUM, tf.reduce_sum(batch["masked_lm_weights"]))
        global_weight = tf.maximum(global_weight, 1.0)
        global_examples = float(self.config.train.train_batch_size)
        variables = self.model.trainable_variables
        k = self.config.train.gradient_accumulation_steps
        if k == 1:
            grads, stats = self._grads_fn(batch, global_weight, global_examples)
        else:
            micro = {key: tf.reshape(v, [k, -1] + v.shape[1:].as_list()) for key, v in batch.items()}
            grads = [tf.zeros_like(v) for v in variables]
            stats = {key: tf.constant(0.0) for key in STAT_KEYS}
            for i in tf.range(k):
                g, s = self._grads_fn({key: v[i] for key, v in micro.items()}, global_weight, global_examples)
                grads = [a + b for a, b in zip(grads, g, strict=True)]
                stats = {key: stats[key] + s[key] for key in STAT_KEYS}
        # Dense gradients: the embedding lookup's IndexedSlices repeat indices, and Keras's global-norm
        # clipping would count each repeat separately (a wrong norm) before it merges them.
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        if self.accelerator.precision == "float16":
            grads = self.optimizer.get_unscaled_gradients(grads)
        self.optimizer.apply_gradients(zip(grads, variables, strict=True))
        return stats

    def _train_loop_fn(self, iterator, steps):
        totals = {key: tf.constant(0.0) for key in STAT_KEYS}
        ids = tf.TensorArray(tf.int64, size=steps)  # the examples each step used, in global batch order
        for i in tf.range(steps):
            batch = next(iterator)
            per_replica = self.strategy.run(self._replica_step, args=(batch,))
            totals = {key: totals[key] + self.strategy.reduce(SUM, per_replica[key], axis=None)
                      for key in STAT_KEYS}
            if self.config.train.log_example_ids:
                ids = ids.write(i, self.strategy.gather(batch["example_id"], axis=0))
        return totals, (ids.stack() if self.config.train.log_example_ids else tf.zeros([0], tf.int64))

    def _eval_replica(self, batch):
        _, stats = self._forward_stats(batch, 1.0, 1.0, training=False)
        return stats

    def _eval_loop_fn(self, batch):
        per_replica = self.strategy.run(self._eval_replica, args=(batch,))
        return {key: self.strategy.reduce(SUM, per_replica[key], axis=None) for key in STAT_KEYS}

    # -- public API ----------------------------------------------------------------------------------
    @property
    def step(self) -> int:
        return int(self.optimizer.iterations.numpy())

    def train_steps(self, steps: int) -> dict:
        """Run ``steps`` optimizer steps (in calls of steps_per_execution); return their mean metrics.

        With ``log_example_ids`` the ids of the examples each step used are kept in ``self.example_ids``
        as ``(step, ids)`` pairs until the caller takes them.
        """
        if self.train_iterator is None:
            self.start_input(self.step)
        totals = {key: 0.0 for key in STAT_KEYS}
        while steps > 0:
            n = min(steps, self.steps_per_execution)
            first = self.step
            sums, ids = self._train_loop(self.train_iterator, tf.constant(n))
            totals = {key: totals[key] + float(sums[key]) for key in STAT_KEYS}
            if self.config.train.log_example_ids:
                self.example_ids.extend((first + 1 + i, row.tolist()) for i, row in enumerate(ids.numpy()))
            steps -= n
        return metrics_from_sums(totals)

    def evaluate(self) -> dict | None:
        """MLM loss/accuracy/perplexity and NSP loss/accuracy over up to max_eval_steps eval batches."""
        if self.eval_dataset is None:
            return None
        totals = {key: 0.0 for key in STAT_KEYS}
        for batch in self.eval_dataset:
            sums = self._eval_loop(batch)
            totals = {key: totals[key] + float(sums[key]) for key in STAT_KEYS}
        if not totals["examples"]:
            return None
        return metrics_from_sums(totals)

    def learning_rate(self) -> float:
        opt = getattr(self.optimizer, "inner_optimizer", self.optimizer)
        return float(opt.learning_rate)

    def write_run_files(self, output_dir: str) -> None:
        """Record the resolved configuration and the model shape in the run folder."""
        path = Path(output_dir)
        path.mkdir(parents=True, exist_ok=True)
        self.config.save(path / "config.json")
        self.bert_config.to_json_file(path / "bert_config.json")


def _next_boundary(step: int, every: int, total: int) -> int:
    return min(total, (step // every + 1) * every) if every else total


def run_training(trainer: Trainer, output_dir: str, progress: bool | None = None) -> TrainResult:
    """The loop: resume from the newest checkpoint, train in chunks, log, evaluate, checkpoint, stop in time.

    Checkpoints are saved every ``save_checkpoints_steps``, at the end, and before stopping for the
    session deadline or SIGTERM/SIGINT; starting again in the same folder continues exactly.
    """
    config, t = trainer.config, trainer.config.train
    total = t.num_train_steps
    identity = run_identity(config, trainer.bert_config, trainer.data)
    check_can_resume(output_dir, identity)
    manager = CheckpointManager(output_dir, tf.train.Checkpoint(model=trainer.model, optimizer=trainer.optimizer),
                                keep_max=config.storage.keep_checkpoint_max, mirror=config.storage.mirror_dir or None)
    restored = manager.restore_latest()
    trainer.write_run_files(output_dir)
    record_identity(output_dir, identity)
    train_seconds = restored.metadata.get("train_seconds", 0.0) if restored else 0.0
    if restored:
        log.info("Resuming from %s: step %d of %d.", restored.path, trainer.step, total)
    trainer.start_input(trainer.step)
    logs = Path(output_dir) / "logs"
    train_writer = tf.summary.create_file_writer(str(logs / "train"))
    eval_writer = tf.summary.create_file_writer(str(logs / "eval"))
    result = TrainResult(output_dir=output_dir, steps=trainer.step)
    if trainer.step == 0:
        result.initial_eval = trainer.evaluate()
        if result.initial_eval:
            _write_scalars(eval_writer, result.initial_eval, 0)
            log.info("Eval at step 0: %s", _format(result.initial_eval))
    from tqdm.auto import tqdm

    bar = tqdm(total=total, initial=trainer.step, unit="step", disable=(not progress) if progress is not None
               else None, dynamic_ncols=True, mininterval=1.0)
    guard = SessionGuard(session_deadline(t.session_hours), margin_seconds=t.session_margin_minutes * 60)
    timed_steps, timed_seconds, started = 0, 0.0, time.perf_counter()
    first, steps_per_s = True, 0.0

    def save(step: int) -> None:
        manager.save(step, {"records_consumed": step * t.train_batch_size, "train_seconds": train_seconds,
                            "steps_per_second": steps_per_s, "saved_at": time.time()})

    try:
        while trainer.step < total:
            step = trainer.step
            target = min(_next_boundary(step, t.log_every_steps, total),
                         _next_boundary(step, t.eval_every_steps, total),
                         _next_boundary(step, t.save_checkpoints_steps, total),
                         step + trainer.steps_per_execution)
            tick = time.perf_counter()
            metrics = trainer.train_steps(target - step)
            seconds = time.perf_counter() - tick
            train_seconds += seconds
            _append_example_ids(trainer, logs)
            if first:  # graph build and compilation: reported apart, kept out of the rates
                result.seconds_to_first_step, first = time.perf_counter() - started, False
            else:
                timed_steps, timed_seconds = timed_steps + target - step, timed_seconds + seconds
            steps_per_s = timed_steps / timed_seconds if timed_seconds else (target - step) / seconds
            metrics.update(steps_per_second=steps_per_s, examples_per_second=steps_per_s * t.train_batch_size,
                           learning_rate=trainer.learning_rate())
            result.history.append({"step": target, **metrics})
            bar.update(target - bar.n)
            bar.set_postfix(loss=f"{metrics['loss']:.3f}", mlm_acc=f"{metrics['mlm_accuracy']:.3f}",
                            steps_s=f"{steps_per_s:.2f}", ex_s=f"{steps_per_s * t.train_batch_size:.1f}")
            if target % t.log_every_steps == 0 or target == total:
                _write_scalars(train_writer, metrics, target)
                eta = (total - target) / steps_per_s if steps_per_s else float("nan")
                log.info("step %d/%d %s, %.2f steps/s, %.1f examples/s, ETA %s", target, total, _format(metrics),
                         steps_per_s, steps_per_s * t.train_batch_size, _hms(eta))
            if t.eval_every_steps and target % t.eval_every_steps == 0 and target < total:
                evaluation = trainer.evaluate()
                if evaluation:
                    _write_scalars(eval_writer, evaluation, target)
                    log.info("Eval at step %d: %s", target, _format(evaluation))
            saved = target % t.save_checkpoints_steps == 0 or target == total
            if saved:
                save(target)
            for callback in trainer.callbacks:
                callback(trainer, target)
            reason = guard.should_stop(next_chunk_seconds=seconds)
            if reason and target < total:
                if not saved:
                    save(target)
                result.stopped_reason = reason
                log.warning("Stopped at step %d of %d: %s. Run the same command again (same output_dir) to "
                            "continue from this step.", target, total, reason)
                break
    finally:
        guard.close()
        bar.close()
        if not manager.wait_for_mirror(timeout=600):
            log.warning("The checkpoint mirror %s is behind: %s", config.storage.mirror_dir, manager.mirror_error)
        manager.close()
    result.steps = trainer.step
    result.examples_per_second = (timed_steps / timed_seconds * t.train_batch_size) if timed_seconds else 0.0
    if result.stopped_reason:
        return result
    result.final_eval = trainer.evaluate()
    if result.final_eval:
        _write_scalars(eval_writer, result.final_eval, result.steps)
        log.info("Final eval at step %d: %s", result.steps, _format(result.final_eval))
    summary = {"steps": result.steps, "initial_eval": result.initial_eval, "final_eval": result.final_eval,
               "examples_per_second": result.examples_per_second,
               "seconds_to_first_step": result.seconds_to_first_step, "train_seconds": train_seconds,
               "accelerator": trainer.accelerator.describe()}
    (Path(output_dir) / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return result


def _append_example_ids(trainer: Trainer, logs: Path) -> None:
    """Append the example ids each step used to logs/example_ids.jsonl (a replayed step appears again)."""
    if not trainer.example_ids:
        return
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "example_ids.jsonl", "a", encoding="utf-8") as handle:
        for step, ids in trainer.example_ids:
            handle.write(json.dumps({"step": step, "ids": ids}) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    trainer.example_ids.clear()


def train(config: Config | None = None, *, progress: bool | None = None, **kwargs) -> TrainResult:
    """Pretrain (or continue pretraining) BERT as configured: ``train(data_dir=..., output_dir=..., ...)``."""
    config = config or Config()
    config.update(kwargs)
    config.validate()
    output_dir = config.storage.output_dir
    if not output_dir:
        raise UserInputError("Set output_dir: the run folder (config, logs and weights go there).")
    if "://" in output_dir:
        raise UserInputError(f"output_dir {output_dir}: train writes to a local (or mounted Drive) folder; "
                             "sync it to Cloud Storage with `tpu-pretrain upload`.")
    trainer = Trainer(config)
    return run_training(trainer, output_dir, progress=progress)


def _write_scalars(writer, metrics: dict, step: int) -> None:
    """TensorBoard scalars via ``tf.summary.write`` (``tf.summary.scalar`` needs the tensorboard package)."""
    from tensorflow.core.framework import summary_pb2

    metadata = summary_pb2.SummaryMetadata()
    metadata.plugin_data.plugin_name = "scalars"
    with writer.as_default(step=step):
        for key, value in metrics.items():
            tf.summary.write(key, tf.constant(float(value), tf.float32), metadata=metadata)
    writer.flush()


def _format(metrics: dict) -> str:
    keys = ("loss", "mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy")
    return ", ".join(f"{k} {metrics[k]:.4f}" for k in keys if k in metrics)


def _hms(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
