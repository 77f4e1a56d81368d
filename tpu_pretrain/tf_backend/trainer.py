"""The model, optimizer and input of one training configuration, and its compiled steps.

Losses are normalised over the *global* batch, so 1 or N replicas, and k accumulated micro-batches,
give the same update; several steps run per compiled call (TPU); the input is opened at an exact step,
its order a pure function of (seed, records consumed), and dropout draws its masks from a stream keyed by
(seed, step, replica, micro-batch), so a resumed run continues exactly. The loop around it is :mod:`..core.loop`.
"""

from __future__ import annotations

import contextlib
import logging
import time

from ..config import Config
from ..core.metrics import STAT_KEYS, add_sums, global_batch_loss, metrics_from_sums
from ..core.peaks import group_peak
from ..core.protocol import Finished
from ..core.resolve import RunPlan
from ..core.schedules import Schedule
from ..data.data_folder import DataInfo, corrupt_shard_error
from ..errors import UserInputError
from .accelerator import Accelerator, find_accelerator, set_precision_policy
from .framework import tf
from .input import DynamicMasking, distributed_dataset
from .model import build_pretraining_model, dropout_seed
from .optimization import create_optimizer
from .state import TensorFlowState
from .stats import pretraining_stats
from .weights import load_init_checkpoint

log = logging.getLogger(__name__)
SUM = tf.distribute.ReduceOp.SUM


@contextlib.contextmanager
def corrupt_shards_named(data: DataInfo):
    """Turn TensorFlow's "corrupted record" into an error naming the shards that no longer match the manifest."""
    try:
        yield
    except tf.errors.DataLossError as exc:
        raise corrupt_shard_error(data.data_dir, exc.message) from None


class Trainer:
    """Builds model, optimizer and input for a configuration, and runs training steps and evaluations."""

    _dispatched = False  # whether a call ran yet (the first one traces and compiles the loop)

    def __init__(self, config: Config, accelerator: Accelerator | None = None):
        self.plan = RunPlan.resolve(config, backend="tensorflow")
        self.data, self.model_config = self.plan.data, self.plan.model_config
        self.vocab, self.with_nsp = self.plan.vocab, self.plan.with_nsp
        t = self.config.train
        found = accelerator or find_accelerator(t.accelerator, tpu_name=t.tpu_name, worker_hosts=t.worker_hosts,
                                                task_index=t.task_index)
        self.plan = self.plan.on_devices("tensorflow", found.found(), found.precision, found.jit_compile)
        self.accelerator = found.decided(self.plan.devices)
        if accelerator is None:
            log.info("Accelerator: %s", self.accelerator.describe())
        self.strategy = self.accelerator.strategy
        self.eval_batch_size = self.plan.devices.eval_batch_size
        self.steps_per_execution = self.plan.devices.steps_per_execution
        self.example_ids: list[tuple[int, list[int]]] = []
        self.init_report = None
        self._build()

    @property
    def config(self) -> Config:
        """The run's resolved settings: its plan's (a new plan on resume)."""
        return self.plan.config

    # -- setup ------------------------------------------------------------------------------------
    def _dynamic_masking(self) -> DynamicMasking | None:
        if not self.config.train.dynamic_masking:
            return None
        if not self.vocab:
            raise UserInputError("dynamic_masking needs the vocab: set vocab_file.")
        return DynamicMasking.from_vocab(self.vocab, self.config.data.masked_lm_prob)

    def _build(self) -> None:
        t, d = self.config.train, self.config.data
        tf.keras.utils.set_random_seed(t.train_seed)
        set_precision_policy(self.accelerator)
        with self.strategy.scope():
            self.pretraining = build_pretraining_model(self.model_config, d.max_seq_length, d.max_predictions_per_seq,
                                                       self.with_nsp)
            self.model = self.pretraining.model
            if self.config.model.init_checkpoint:
                self.init_report = load_init_checkpoint(self.pretraining, self.config.model.init_checkpoint)
            self.optimizer = self._create_optimizer()
        self.train_dataset = self.train_iterator = None  # opened at the (restored) step by start_input()
        self.eval_dataset = None
        if self.eval_batch_size:
            self.eval_dataset = distributed_dataset(
                self.strategy, self.data.eval_files, self.eval_batch_size, max_steps=t.max_eval_steps, training=False,
                max_seq_length=d.max_seq_length, max_predictions_per_seq=d.max_predictions_per_seq, seed=t.train_seed,
                drop_remainder=self.accelerator.kind == "tpu")  # static shapes on a TPU; elsewhere every record
        # A TPU compiles the whole step with XLA by itself. Elsewhere jit_compile asks for the same: the whole
        # replica step in one XLA computation on one device; under MirroredStrategy (GPUs, logical CPUs) the
        # cross-replica sums cannot sit inside one (merge_call), so forward, backward and accumulation form one
        # computation and the optimizer compiles its update per variable.
        xla = self.accelerator.jit_compile and self.accelerator.kind != "tpu"
        self._gradients_fn = tf.function(self._gradients, jit_compile=xla)
        whole = xla and not isinstance(self.strategy, tf.distribute.MirroredStrategy)
        self._step_fn = tf.function(self._replica_step, jit_compile=True) if whole else self._replica_step
        self.xla = ("whole step (TPU)" if self.accelerator.kind == "tpu" else "whole replica step" if whole
                    else "gradients, then each variable's update" if xla else "off")  # what XLA compiles
        self._train_loop = tf.function(self._train_loop_fn)
        self._eval_loop = tf.function(self._eval_loop_fn)

    def _create_optimizer(self):
        t = self.config.train
        optimizer = create_optimizer(
            schedule=self.plan.schedule, optimizer=t.optimizer, weight_decay_rate=t.weight_decay_rate,
            beta_1=t.adam_beta1, beta_2=t.adam_beta2, epsilon=t.adam_epsilon, clip_norm=t.clip_norm,
            variables=self.model.trainable_variables,
            jit_compile=self.accelerator.jit_compile and self.accelerator.kind != "tpu")
        if self.accelerator.precision == "float16":
            optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
        getattr(optimizer, "inner_optimizer", optimizer).build(self.model.trainable_variables)
        return optimizer

    def start_input(self, step: int) -> None:
        """Open the training input at ``step``: the order is a pure function of (seed, records consumed)."""
        t, d = self.config.train, self.config.data
        self.train_dataset = distributed_dataset(
            self.strategy, self.data.train_files, t.train_batch_size, training=True,
            max_seq_length=d.max_seq_length, max_predictions_per_seq=d.max_predictions_per_seq, seed=t.train_seed,
            shuffle_buffer_size=t.shuffle_buffer_size, masking=self._dynamic_masking(),
            start_record=step * t.train_batch_size, records_per_epoch=self.data.train_instances)
        self.train_iterator = iter(self.train_dataset)

    # -- compiled steps ----------------------------------------------------------------------------
    def _forward_stats(self, batch, global_weight, global_examples, training: bool):
        """This replica's summed statistics, and its share of the global-batch loss."""
        inputs = [batch["input_ids"], batch["segment_ids"], batch["masked_lm_positions"]]
        stats = pretraining_stats(self.model(inputs, training=training), batch, self.with_nsp)
        return global_batch_loss(stats, global_weight, global_examples, self.with_nsp), stats

    def _compute_gradients(self, batch, global_weight, global_examples, seed):
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape, dropout_seed(seed):
            loss, stats = self._forward_stats(batch, global_weight, global_examples, training=True)
            scaled = self.optimizer.get_scaled_loss(loss) if self.accelerator.precision == "float16" else loss
        return tape.gradient(scaled, variables), stats

    def _gradients(self, batch, global_weight, global_examples, seed):
        """Gradients and statistics of this replica's share, summed over micro-batches when accumulating."""
        k = self.config.train.gradient_accumulation_steps
        if k == 1:
            grads, stats = self._compute_gradients(batch, global_weight, global_examples, seed)
        else:
            micro = {key: tf.reshape(v, [k, -1] + v.shape[1:].as_list()) for key, v in batch.items()}
            grads = [tf.zeros_like(v) for v in self.model.trainable_variables]
            stats = {key: tf.constant(0.0) for key in STAT_KEYS}
            for i in tf.range(k):
                g, s = self._compute_gradients({key: v[i] for key, v in micro.items()}, global_weight, global_examples,
                                               tf.random.experimental.stateless_fold_in(seed, tf.cast(i, tf.int64)))
                grads = [a + b for a, b in zip(grads, g, strict=True)]
                stats = {key: stats[key] + s[key] for key in STAT_KEYS}
        # Dense gradients: the embedding lookup's IndexedSlices repeat indices, and Keras's global-norm
        # clipping would count each repeat separately (a wrong norm) before it merges them.
        return [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads], stats

    def _replica_step(self, batch):
        """One optimizer step on this replica's share of the global batch."""
        context = tf.distribute.get_replica_context()
        global_weight = context.all_reduce(SUM, tf.reduce_sum(batch["masked_lm_weights"]))
        global_weight = tf.maximum(global_weight, 1.0)
        # Dropout's stream: a pure function of (seed, step, replica, micro-batch), like the data order.
        seed = tf.stack([tf.constant(self.config.train.train_seed, tf.int64),
                         tf.cast(self.optimizer.iterations, tf.int64)])
        seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(context.replica_id_in_sync_group, tf.int64))
        grads, stats = self._gradients_fn(batch, global_weight, float(self.config.train.train_batch_size), seed)
        if self.accelerator.precision == "float16":
            grads = self.optimizer.get_unscaled_gradients(grads)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))
        return stats

    def _train_loop_fn(self, iterator, steps):
        totals = {key: tf.constant(0.0) for key in STAT_KEYS}
        ids = tf.TensorArray(tf.int64, size=steps)  # the examples each step used, in global batch order
        for i in tf.range(steps):
            batch = next(iterator)
            per_replica = self.strategy.run(self._step_fn, args=(batch,))
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

    def dispatch(self, steps: int) -> Finished:
        """Run one call of ``steps`` steps (TensorFlow's calls return when done); the first one compiles the loop."""
        tick = time.perf_counter()
        metrics = self.train_steps(steps)
        first, self._dispatched = not self._dispatched, True
        ended = time.perf_counter()
        return Finished(metrics, steps, ended - tick if first else 0.0, ended)

    def train_steps(self, steps: int) -> dict:
        """Run ``steps`` optimizer steps (in calls of steps_per_execution); return their mean metrics.

        With ``log_example_ids`` the ids of the examples each step used are kept in ``self.example_ids``
        as ``(step, ids)`` pairs until the caller takes them.
        """
        if self.train_iterator is None:
            self.start_input(self.step)
        totals: dict = {}
        while steps > 0:
            n = min(steps, self.steps_per_execution)
            first = self.step
            with corrupt_shards_named(self.data):
                sums, ids = self._train_loop(self.train_iterator, tf.constant(n))
            totals = add_sums(totals, sums)
            if self.config.train.log_example_ids:
                self.example_ids.extend((first + 1 + i, row.tolist()) for i, row in enumerate(ids.numpy()))
            steps -= n
        return metrics_from_sums(totals)

    def evaluate(self) -> dict | None:
        """MLM loss/accuracy/perplexity and NSP loss/accuracy over up to max_eval_steps eval batches."""
        if self.eval_dataset is None:
            return None
        totals: dict = {}
        with corrupt_shards_named(self.data):
            for batch in self.eval_dataset:
                totals = add_sums(totals, self._eval_loop(batch))
        if not totals.get("examples"):
            return None
        return {**metrics_from_sums(totals), "sequences": int(totals["examples"])}

    def weights_finite(self) -> bool:
        """Whether every weight and optimizer slot is finite (no NaN or Inf): what may be saved."""
        optimizer = getattr(self.optimizer, "inner_optimizer", self.optimizer)
        variables = self.model.trainable_variables + [v for v in optimizer.variables if v.dtype.is_floating]
        return all(bool(tf.reduce_all(tf.math.is_finite(v))) for v in variables)

    def _inner_optimizer(self):
        return getattr(self.optimizer, "inner_optimizer", self.optimizer)

    def use_schedule(self, schedule: Schedule) -> None:
        """Follow ``schedule`` (a resumed run's, re-planned by the core); read when the step is traced."""
        self._inner_optimizer()._learning_rate.schedule = schedule

    def checkpoint_state(self) -> TensorFlowState:
        """Model and optimizer (with its step) in TensorFlow's checkpoint format."""
        return TensorFlowState(tf.train.Checkpoint(model=self.model, optimizer=self.optimizer))

    @property
    def precision(self) -> str:
        return self.accelerator.precision

    @property
    def peak_flops(self) -> float | None:
        """The replicas' published dense peak at the training precision (None for a CPU or an unknown device)."""
        return group_peak(self.accelerator.device_name, self.precision, self.accelerator.num_replicas)

    @property
    def is_chief(self) -> bool:
        """Whether this process writes the run folder (one writer when several machines train)."""
        return self.accelerator.is_chief

    def any_worker(self, flag: bool) -> bool:
        """``flag`` agreed over every worker (all must call it at the same step); itself on one machine."""
        if self.accelerator.cluster is None:
            return flag
        from .cluster import any_worker

        return any_worker(self.strategy, flag)

    def describe(self) -> str:
        return f"TensorFlow, {self.accelerator.describe()}"

    def close(self) -> None:
        """Nothing to release: tf.data stops with its iterator."""
