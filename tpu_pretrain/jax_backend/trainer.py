"""The JAX backend's trainer: model, optimizer and input of one configuration, and its compiled steps.

The step itself (loss, accumulated gradients, clipping, AdamW/LAMB, the float16 loss scale) is pure functions in
:mod:`.step`; this class holds the state, places it and the input on the devices (``jax.sharding``: weights
replicated, every batch split over every process's devices) and compiles the steps, several to a call (a ``lax.scan``
over stacked batches). The same guarantees as :mod:`..tf_backend.trainer`: losses normalised over the *global*
batch (any number of devices, and k accumulated micro-batches, give the same update), bfloat16 compute where the
accelerator has it (float16 with dynamic loss scaling where asked for: GPUs without bfloat16, such as the T4),
and the input opened at an exact step, masked afresh with ``dynamic_masking``. :func:`..core.loop.run_training`
drives it as it drives the TensorFlow trainer.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import time

import numpy as np

from . import select_keras_backend

select_keras_backend()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402

from ..config import Config  # noqa: E402
from ..core.metrics import add_sums, metrics_from_sums  # noqa: E402
from ..core.peaks import group_peak  # noqa: E402
from ..core.resolve import RunPlan  # noqa: E402
from ..core.schedules import Schedule  # noqa: E402
from ..data.dynamic_masking import DynamicMasking  # noqa: E402
from ..errors import UserInputError  # noqa: E402
from .calls import CompletionClock, PendingCall, cache_size  # noqa: E402
from .devices import Devices, detect_devices, fetch  # noqa: E402
from .families import jax_family  # noqa: E402
from .input import BATCH_FEATURES, TrainingBatches, batch_shapes, document_separator, eval_batches  # noqa: E402
from .prefetch import BatchPrefetcher, chunk_stacker  # noqa: E402
from .processes import is_chief, spans_processes, start_processes  # noqa: E402
from .state import LOSS_SCALE, LOSS_SCALE_ARRAYS, PARAMS, JaxState  # noqa: E402
from .step import OptimizerSettings, StepSpec, decayed, eval_stats, init_loss_scale, init_slots, train_chunk  # noqa: E402

log = logging.getLogger(__name__)


def process_independent(paths: list[str]) -> list[str]:
    """Keras's variable paths as a new process names them: Keras numbers its RNG-state variables with a
    process-wide counter (``seed_generator_7/...`` in a second model), and a checkpoint stores them by name."""
    counts: dict[str, int] = {}
    names = []
    for path in paths:
        first, _, rest = path.partition("/")
        base = re.sub(r"_\d+$", "", first)
        n = counts[base] = counts.get(base, -1) + 1
        names.append("/".join(filter(None, (f"{base}_{n}" if n else base, rest))))
    return names


class JaxTrainer:
    """Builds model, optimizer and input for a configuration, and runs training steps and evaluations."""

    prefetch_chunks = 2  # calls' worth of batches placed on the devices ahead of the steps; 0: none (serial)
    _prefetch: BatchPrefetcher | None = None
    _stack = None
    _in_flight = None  # the statistics of the call dispatched last
    _compiled_once = False  # whether a call was dispatched (where JAX does not count its compiled versions)

    def __init__(self, config: Config, devices: Devices | None = None, plan: RunPlan | None = None):
        self.plan = plan or RunPlan.resolve(config, backend="jax")
        self.data, self.model_config = self.plan.data, self.plan.model_config
        self.vocab, self.with_nsp = self.plan.vocab, self.plan.with_nsp
        t = self.config.train
        if devices is None:  # several processes join before JAX is used: then the mesh spans all their devices
            start_processes(t.coordinator_address, t.num_processes, t.process_index)
        found = devices or detect_devices(t.accelerator)
        self.plan = self.plan.on_devices("jax", found.found(), found.precision)
        self.devices = found.decided(self.plan.devices)
        if devices is None:
            log.info("JAX devices: %s", self.devices.describe())
        self.eval_batch_size = self.plan.devices.eval_batch_size
        self.steps_per_execution = self.plan.devices.steps_per_execution
        # full calls with their trip count compiled in, where a loop would wait on the host after every step: a GPU's
        self.full_calls_counted = self.devices.kind == "gpu"
        self.carry_copies = self.devices.kind == "gpu"  # and the weights' bfloat16 copies carried through their steps
        self.settings = OptimizerSettings.from_config(t, self.plan.schedule)
        self.example_ids: list[tuple[int, list[int]]] = []
        self.train_batches = self.init_report = None
        self._build()

    @property
    def config(self) -> Config:
        """The run's resolved settings: its plan's (a new plan on resume, or for another batch)."""
        return self.plan.config

    # -- setup ------------------------------------------------------------------------------------
    def _build(self) -> None:
        t, d = self.config.train, self.config.data
        keras.utils.set_random_seed(t.train_seed)
        self.family = jax_family(self.model_config)  # BERT or ModernBERT: its model, weight names and layout
        self.model = self.family.build(self.model_config, d.max_seq_length, d.max_predictions_per_seq, self.with_nsp,
                                       dtype=self.devices.dtype_policy)
        self.model.document_separator, self.model.data_mesh = document_separator(self.plan), self.devices.mesh
        by_id = {id(v): name for name, v in self.family.variables(self.model).items()}
        self.names = [by_id[id(v)] for v in self.model.trainable_variables]
        self.keras_names = process_independent([v.path for v in self.model.non_trainable_variables])
        if self.config.model.init_checkpoint:
            self._load_init_checkpoint(self.config.model.init_checkpoint)
        params = [v.value for v in self.model.trainable_variables]
        state = {"params": params, "keras": [v.value for v in self.model.non_trainable_variables],
                 "slots": init_slots(params), "step": jnp.zeros((), jnp.int32)}
        if self.loss_scaling:
            state[LOSS_SCALE] = init_loss_scale()
        self.state = self._place(state)
        self.decay_mask = decayed(params)
        self._compile()

    @property
    def loss_scaling(self) -> bool:
        """float16 compute: the loss is scaled (its small gradients would underflow float16 otherwise)."""
        return self.devices.precision == "float16"

    @property
    def spec(self) -> StepSpec:
        """What the steps of :mod:`.step` are made of, from the current settings."""
        return StepSpec(self.model.stateless_call, self.with_nsp, self.config.train.gradient_accumulation_steps,
                        self.devices.num_replicas, self.settings, self.decay_mask, self.carry_copies,
                        self.devices.kind)

    def _compile(self) -> None:
        """The jitted steps; the spec (the optimizer's settings and schedule among them) is constant in them."""
        replicated, spec, options = self.devices.replicated(), self.spec, self.devices.jit_options()
        self._train_chunk = jax.jit(functools.partial(train_chunk, spec), donate_argnums=(0,),
                                    out_shardings=(replicated, replicated), **options)
        self._eval_step = jax.jit(functools.partial(eval_stats, spec), out_shardings=replicated, **options)

    def _place(self, tree):
        sharding = self.devices.replicated()
        if self.devices.abstract:  # devices only compiled for (the plan command's): the shapes are all it needs
            return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)
        if self.devices.processes > 1:  # the same values on every process: each places its own copies
            return self.devices.put(tree, sharding)
        return jax.device_put(tree, sharding)

    def _load_init_checkpoint(self, path: str) -> None:
        """Released weights by the family's names: BERT's Google or Hugging Face checkpoints by Google name (a
        Google TF checkpoint is read with NumPy alone), ModernBERT's transformers folders by transformers' names."""
        loaded, missing = self.load_stored_weights(self.family.read_init(path), f"init_checkpoint {path}")
        log.info("Initialised %d weights from %s; %d keep their random init%s", len(loaded), path, len(missing),
                 f": {', '.join(missing[:6])}" if missing else "")

    def start_input(self, step: int) -> None:
        """Open the training input at ``step``: the order is a pure function of (seed, records consumed).

        Whatever was read ahead for another position is dropped; reading ahead starts again from ``step``."""
        t, d = self.config.train, self.config.data
        self.close()
        self.last_step = self._dispatched = step
        self.train_batches = TrainingBatches(self.data.train_files, t.train_batch_size, d.max_seq_length,
                                             d.max_predictions_per_seq, seed=t.train_seed,
                                             start_record=step * t.train_batch_size, masking=self._masking(),
                                             rows=self._rows())
        self._prefetcher()

    def _rows(self) -> slice:
        """The rows of each global batch this process reads: all on one process, else those on its devices."""
        return self.devices.local_rows(self.config.train.train_batch_size) if self.devices.processes > 1 else slice(
            None)

    def _place_batch(self, batch: dict) -> dict:
        batch = {k: batch[k] for k in BATCH_FEATURES}
        if self.devices.processes > 1:  # this process's rows of the global batch
            return self.devices.put_local_rows(batch)
        return jax.device_put(batch, self.devices.split())

    def _masking(self) -> DynamicMasking | None:
        if not self.config.train.dynamic_masking:
            return None
        if not self.vocab:
            raise UserInputError("dynamic_masking needs the vocab: set vocab_file.")
        return DynamicMasking.from_vocab(self.vocab, self.config.data.masked_lm_prob)

    def _prefetcher(self) -> BatchPrefetcher:
        """The prefetcher over ``train_batches`` (made again when they were replaced, as tests do)."""
        if self.train_batches is None:
            self.start_input(self.step)
        if self._prefetch is None or self._prefetch.source is not self.train_batches:
            if self._prefetch is not None:
                self._prefetch.close()
            self._prefetch = BatchPrefetcher(self.train_batches, self._place_batch,
                                             self.prefetch_chunks * self.steps_per_execution)
        return self._prefetch

    def close(self) -> None:
        """Stop reading ahead and the input's reading threads; the next steps open the input again at their step."""
        if self._prefetch is not None:
            self._prefetch.close()
            self._prefetch = None
        if isinstance(self.train_batches, TrainingBatches):
            self.train_batches.close()
            self.train_batches = None

    # -- compiled steps ---------------------------------------------------------------------------
    def chunk_shapes(self, steps: int) -> dict:
        """One call's input as shapes: ``steps`` global batches, split over the devices as :meth:`train_steps` does."""
        d, sharding = self.config.data, self.devices.split(axis=1)
        return {name: jax.ShapeDtypeStruct((steps, *shape), dtype, sharding=sharding) for name, (shape, dtype) in
                batch_shapes(self.config.train.train_batch_size, d.max_seq_length, d.max_predictions_per_seq).items()}

    def set_batch(self, batch: int, accumulation: int) -> None:
        """Global batches of ``batch`` in ``accumulation`` micro-batches (traced into the steps: compiled again)."""
        self.plan = self.plan.with_batch(batch, accumulation)
        self._compile()

    def lower_chunk(self, steps: int = 1):
        """The training call of ``steps`` steps lowered for this trainer's devices, from shapes (:mod:`.plan`)."""
        count = jax.ShapeDtypeStruct((), jnp.int32, sharding=self.devices.replicated())
        return self._train_chunk.lower(self.state, self.chunk_shapes(steps), count)

    # -- public API -----------------------------------------------------------------------------------
    last_step = 0  # the step last read: what a failure's message can still name once the state is unusable
    _dispatched = 0  # the step the calls dispatched so far end at

    @property
    def step(self) -> int:
        """The optimizer updates made (a read of the devices' state: it waits for the calls in flight)."""
        self.last_step = int(fetch(self.state["step"]))
        return self.last_step

    def dispatch(self, steps: int) -> PendingCall:
        """Start ``steps`` optimizer steps (1 to steps_per_execution) as one compiled call and return at once: the
        devices run it while the host reads the last call's figures and places the next call's batches.

        The batches come from :class:`.prefetch.BatchPrefetcher`, placed ahead; when none is ready the devices
        are let finish first, so ``input_wait_seconds`` counts only time they had nothing else to do. The one
        compiled call takes any count up to steps_per_execution (:func:`.step.train_chunk`), and where
        :attr:`full_calls_counted` a full call is one of its own whose trip count the compiler knows; the time a
        dispatch spent compiling is the call's ``compile_seconds``.
        """
        if not 0 < steps <= self.steps_per_execution:
            raise ValueError(f"a call runs 1 to {self.steps_per_execution} steps, not {steps}")
        prefetch = self._prefetcher()
        if self._stack is None:
            self._stack = chunk_stacker(self.devices.split(axis=1), self.devices.replicated(), self.steps_per_execution)
        waited = prefetch.wait_seconds
        pulled = prefetch.take(steps, idle=self._let_devices_finish)
        batches, count = self._stack(tuple(b for _, b in pulled))
        compiled, tick = cache_size(self._train_chunk), time.perf_counter()
        counted = self.full_calls_counted and steps == self.steps_per_execution  # else the loop to a count
        self.state, sums = self._train_chunk(self.state, batches, None if counted else count)
        grew = compiled is None and not self._compiled_once or cache_size(self._train_chunk) != compiled
        compile_seconds = time.perf_counter() - tick if grew else 0.0
        self._compiled_once = True
        if self.config.train.log_example_ids and self.is_chief:
            self.example_ids.extend((self._dispatched + 1 + i, ids.tolist()) for i, (ids, _) in enumerate(pulled))
        self._dispatched += steps
        self._in_flight = sums
        return PendingCall(self._read, sums, steps, self._dispatched, prefetch.wait_seconds - waited, compile_seconds,
                           CompletionClock(sums))

    def _let_devices_finish(self) -> None:
        if self._in_flight is not None:
            jax.block_until_ready(self._in_flight)

    @spans_processes
    def _read(self, call: PendingCall) -> dict:
        """A dispatched call's summed statistics, waiting for it (the one host sync a call costs)."""
        totals = add_sums({}, fetch(call.sums))
        self.last_step = max(self.last_step, call.last)
        return totals

    def train_steps(self, steps: int) -> dict:
        """Run ``steps`` optimizer steps (calls of steps_per_execution, dispatched back to back) and return their
        mean metrics, with the time the devices waited for input (``input_wait_seconds``, and its share)."""
        tick, calls, done = time.perf_counter(), [], 0
        while done < steps:
            calls.append(self.dispatch(min(self.steps_per_execution, steps - done)))
            done += calls[-1].steps
        totals: dict = {}
        for call in calls:
            totals = add_sums(totals, call.totals())
        wait = sum(call.input_wait_seconds for call in calls)
        return {**metrics_from_sums(totals), "input_wait_seconds": wait,
                "input_wait_share": wait / max(time.perf_counter() - tick, 1e-9)}

    @spans_processes
    def evaluate(self) -> dict | None:
        """Eval metrics and their count over up to max_eval_steps batches, the last shorter one included."""
        if not self.eval_batch_size:
            return None
        d, t, totals, n = self.config.data, self.config.train, {}, self.devices.num_replicas
        for batch in eval_batches(self.data.eval_files, self.eval_batch_size, d.max_seq_length,
                                  d.max_predictions_per_seq, t.max_eval_steps):
            split = self.devices.split() if len(batch["input_ids"]) % n == 0 else self.devices.replicated()
            batch = {k: batch[k] for k in BATCH_FEATURES}  # every process reads the whole eval batch
            batch = self.devices.put(batch, split) if self.devices.processes > 1 else jax.device_put(batch, split)
            totals = add_sums(totals, fetch(self._eval_step(self.state, batch)))
        return {**metrics_from_sums(totals), "sequences": int(totals["examples"])} if totals.get("examples") else None

    @property
    def is_chief(self) -> bool:
        """Whether this process writes the run folder: the only one, or process 0 of several."""
        return self.devices.abstract or self.devices.processes == 1 or is_chief()

    @spans_processes
    def any_worker(self, flag: bool) -> bool:
        """``flag`` of any process (every process must ask at the same point: it waits for the others)."""
        if self.devices.abstract or self.devices.processes == 1:
            return flag
        from jax.experimental import multihost_utils

        return bool(np.any(multihost_utils.process_allgather(np.asarray(flag))))

    def use_schedule(self, schedule: Schedule) -> None:
        """Follow ``schedule`` (a resumed run's, re-planned by the core): the steps are compiled again with it."""
        if schedule != self.settings.schedule:
            self.settings = dataclasses.replace(self.settings, schedule=schedule)
            self._compile()

    @property
    def precision(self) -> str:
        return self.devices.precision

    @property
    def peak_flops(self) -> float | None:
        """The devices' published dense peak at the training precision (None for a CPU or an unknown device)."""
        kind = getattr(self.devices.devices[0], "device_kind", "") if self.devices.kind != "cpu" else ""
        return group_peak(kind, self.precision, self.devices.num_replicas)

    def describe(self) -> str:
        return f"JAX (Keras 3), {self.devices.describe()}"

    @spans_processes
    def weights_finite(self) -> bool:
        """Whether every weight and optimizer moment is finite (no NaN or Inf): what may be saved."""
        leaves = self.state["params"] + self.state["slots"]["m"] + self.state["slots"]["v"]
        return bool(fetch(jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))))

    # -- weights and checkpoints ------------------------------------------------------------------------
    def stored_weights(self) -> dict[str, np.ndarray]:
        """The current weights by stored name, as stored (float32): Google's for BERT, transformers' for ModernBERT."""
        params = fetch(self.state["params"])  # replicated: this process's own copy
        return {n: np.asarray(self.family.to_stored(n, p), np.float32) for n, p in zip(self.names, params, strict=True)}

    def load_stored_weights(self, weights: dict[str, np.ndarray], source: str, strict: bool = False
                            ) -> tuple[list, list]:
        """Load weights by stored name; returns (loaded, missing) names. ``strict``: all must be there."""
        variables = dict(zip(self.names, self.model.trainable_variables, strict=True))
        loaded, missing = self.family.assign(variables, weights, source, strict)
        if hasattr(self, "state"):
            self.state["params"] = self._place([v.value for v in self.model.trainable_variables])
        return loaded, missing

    def _state_arrays(self) -> dict[str, np.ndarray]:
        state, stored = fetch(self.state), self.family.to_stored  # as Google (transformers) stores them
        arrays = {f"{PARAMS}{n}": np.asarray(stored(n, p)) for n, p in zip(self.names, state["params"], strict=True)}
        for slot in ("m", "v"):
            arrays.update({f"{slot}/{n}": np.asarray(stored(n, x))
                           for n, x in zip(self.names, state["slots"][slot], strict=True)})
        arrays.update({f"keras/{n}": np.asarray(x) for n, x in zip(self.keras_names, state["keras"], strict=True)})
        arrays["step"] = np.asarray(state["step"])
        if LOSS_SCALE in state:
            arrays.update({f"{LOSS_SCALE}/{k}": np.asarray(v) for k, v in state[LOSS_SCALE].items()})
        return arrays

    def _put_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """The state from a checkpoint's arrays. The loss scale is float16's alone: a checkpoint without it (an
        older one, or one trained in another precision) starts from the initial scale; others ignore it."""
        unstored = self.family.from_stored
        state = {
            "params": [jnp.asarray(unstored(n, arrays[f"{PARAMS}{n}"])) for n in self.names],
            "slots": {s: [jnp.asarray(unstored(n, arrays[f"{s}/{n}"])) for n in self.names] for s in ("m", "v")},
            "keras": [jnp.asarray(arrays[f"keras/{n}"]) for n in self.keras_names],
            "step": jnp.asarray(arrays["step"], jnp.int32)}
        if self.loss_scaling:
            saved = {k: arrays[f"{LOSS_SCALE}/{k}"] for k in LOSS_SCALE_ARRAYS if f"{LOSS_SCALE}/{k}" in arrays}
            state[LOSS_SCALE] = (init_loss_scale() if len(saved) < len(LOSS_SCALE_ARRAYS) else
                                 {"scale": jnp.asarray(saved["scale"], jnp.float32),
                                  "good_steps": jnp.asarray(saved["good_steps"], jnp.int32)})
        self.state = self._place(state)

    def _state_shapes(self) -> dict[str, tuple]:
        shapes = {"step": ()}
        for n, v in zip(self.names, self.model.trainable_variables, strict=True):
            shape = tuple(self.family.to_stored(n, np.zeros(v.shape, np.int8)).shape)  # as stored
            shapes.update({f"{PARAMS}{n}": shape, f"m/{n}": shape, f"v/{n}": shape})
        shapes.update({f"keras/{n}": tuple(v.shape) for n, v in zip(self.keras_names,
                                                                     self.model.non_trainable_variables, strict=True)})
        if self.loss_scaling:
            shapes.update({f"{LOSS_SCALE}/{k}": () for k in LOSS_SCALE_ARRAYS})
        return shapes

    def checkpoint_state(self) -> JaxState:
        """Weights, optimizer moments, step, dropout's RNG state (and float16's loss scale), as ``state.npz``."""
        return JaxState(self._state_arrays, self._put_state_arrays, self._state_shapes,
                        optional=[f"{LOSS_SCALE}/{k}" for k in LOSS_SCALE_ARRAYS])

