"""A run resolved once, the same for both backends: its configuration completed from its data, the vocab, the
model's shape, the batch geometry, the learning-rate schedule and, once its backend found them, what it does on its
devices (:class:`RunPlan`)."""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, replace

from ..config import DATA, MODERN_RECIPE, Config, TrainConfig, pinned_settings, recipe_line
from ..config_checks import max_predictions
from ..data.data_folder import DataInfo, check_token_ids, read_data_info
from ..data.vocab import Vocab
from ..data.vocab_tokenizer import SPECIAL_TOKENS
from ..errors import UserInputError
from ..models.bert_config import BertConfig
from ..models.families import ModelFamily, family_named
from ..models.modernbert_config import ModernBertConfig
from ..models.shape_request import ShapeRequest
from .device_decision import DeviceDecision, FoundDevices, decide_devices
from .document_masks import decide_document_masks
from .overfit import auto_eval_every_steps
from .run_folder import RunFolder
from .schedules import Schedule, planned, resume

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class RunPlan:
    """What a run is before any framework builds it: settings, data, vocab, model shape, schedule.

    Every setting left to be decided ("auto", -1, 0, the recipe, the data's shapes, the backend, document masks) is
    decided here, once, and the plan's settings are frozen: a changed run (resumed on its recorded schedule, another
    batch tried by the plan command) is a new plan (:meth:`resumed`, :meth:`with_batch`), never an edit. What the
    devices decide (precision, XLA, steps per call, the eval batch) is decided once the backend has found them: the
    plan :meth:`on_devices` holds it (:mod:`.device_decision`), and the backends read it.
    """

    config: Config  # completed from the data and frozen (the caller's is unchanged)
    data: DataInfo
    vocab: Vocab | None  # the vocab it trains with (copied into the run folder); None: planned before it exists
    model_config: BertConfig | ModernBertConfig  # the model's shape, of the run's family
    warmup_was_auto: bool  # num_warmup_steps was -1: a resumed run keeps the warmup its checkpoint recorded
    planned_schedule: Schedule  # what the settings ask for from step 0
    schedule: Schedule  # what the run follows: the planned one, or re-planned on resume
    devices: DeviceDecision | None = None  # what the run does on its devices (:meth:`on_devices`); None: not found yet

    @classmethod
    def resolve(cls, config: Config, backend: str | None = None) -> RunPlan:
        """Read the data folder's description and complete ``config`` from it for ``backend`` (None: the one the
        settings name); check the data fills a batch."""
        if config.storage.output_dir and "://" not in config.storage.output_dir:
            RunFolder(config.storage.output_dir).check_same_family(config.model.model_family)
        log.info("%s", recipe_line(config))
        data = read_data_info(config.storage.data_dir)
        warmup_was_auto = config.train.num_warmup_steps < 0
        config = resolve_config(config, data)
        positions_of_the_run(config)
        vocab = run_vocab(config, data)
        check_data_fills_a_batch(config.train, data)
        model_config = run_model_config(config, data, vocab)
        _decide_run_settings(config, data, backend)
        schedule = planned(config.train)
        return cls(config, data, vocab, model_config, warmup_was_auto, schedule, schedule)

    @classmethod
    def from_settings(cls, config: Config, backend: str | None = None) -> RunPlan:
        """A run planned before its data exists (the plan command): the shapes create-data would write with these
        settings. A ``data_dir``, when set, decides them instead, as in :meth:`resolve`."""
        if config.storage.data_dir:
            return cls.resolve(config, backend)
        config = copy.deepcopy(config)
        d = config.data
        d.max_predictions_per_seq = max_predictions(d.max_seq_length, d.max_predictions_per_seq, d.masked_lm_prob)
        vocab = Vocab.read(d.vocab_file) if d.vocab_file else None
        vocab_size = len(vocab) if vocab else None
        if not (vocab_size or config.model.bert_config_file or config.model.init_checkpoint):
            vocab_size = config.vocab.vocab_size  # a vocab yet to be built, of the size `tpu-pretrain vocab` makes
        data = DataInfo("", [], [], d.max_seq_length, d.max_predictions_per_seq, vocab_size=vocab_size,
                        settings={"no_nsp": d.no_nsp})
        warmup_was_auto = config.train.num_warmup_steps < 0
        config = resolve_config(config, data)
        model_config = run_model_config(config, data, vocab, vocab_to_come=not vocab)
        _decide_run_settings(config, data, backend)
        schedule = planned(config.train)
        return cls(config, data, vocab, model_config, warmup_was_auto, schedule, schedule)

    def resumed(self, recorded: dict | None, step: int) -> tuple[RunPlan, str | None]:
        """The plan of this run restored at ``step`` with the schedule its checkpoint ``recorded``: that schedule
        when the settings are the same, else one re-planned from the rate reached (:func:`.schedules.resume`; the
        second value says what changed). An automatic warmup stays as recorded: it was chosen from the settings the
        run started with."""
        config, planned_schedule = self.config, self.planned_schedule
        if recorded and self.warmup_was_auto:
            warmup = (recorded.get("planned") or {}).get("warmup_end", recorded.get("num_warmup_steps"))
            config = config.replaced(num_warmup_steps=int(warmup if warmup is not None else
                                                          config.train.num_warmup_steps))
            planned_schedule = planned(config.train)
        schedule, change = resume(planned_schedule, recorded, step, config.train.rewarm_steps)
        return replace(self, config=config, planned_schedule=planned_schedule, schedule=schedule), change

    def with_batch(self, batch: int, accumulation: int) -> RunPlan:
        """This plan with global batches of ``batch`` in ``accumulation`` micro-batches (the plan command's search);
        its devices' decision made again for that batch, quietly (said once, for the batch asked for)."""
        plan = replace(self, config=self.config.replaced(train_batch_size=batch,
                                                         gradient_accumulation_steps=accumulation))
        if self.devices is None:
            return plan
        d = self.devices
        fixed = {"precision": d.precision, "jit_compile": d.jit_compile}  # as decided: the devices have not changed
        return replace(plan, devices=decide_devices(d.backend, d.found, plan.config.train, self.data, **fixed,
                                                    say=False))

    def on_devices(self, backend: str, found: FoundDevices, precision: str | None = None,
                   jit_compile: bool | None = None) -> RunPlan:
        """This plan on the devices ``backend`` found: precision, XLA, steps per call and the eval batch decided
        (``auto``/0) with their reasons, logged; the batch checked to split over the replicas. ``precision`` and
        ``jit_compile``: fixed by whoever made the device object (a test, a benchmark, a probe)."""
        decision = decide_devices(backend, found, self.config.train, self.data, precision, jit_compile)
        return replace(self, devices=decision)

    @property
    def family(self) -> ModelFamily:
        return family_named(self.config.model.model_family)

    @property
    def with_nsp(self) -> bool:
        return not self.config.data.no_nsp and self.family.has_nsp

    def training_flops_per_sequence(self) -> float:
        d = self.config.data
        return self.family.training_flops(self.model_config, d.max_seq_length, d.max_predictions_per_seq,
                                          self.config.train.backend)


def _decide_run_settings(config: Config, data: DataInfo, backend: str | None) -> None:
    """The resolver's last decisions, on its own copy, which it then freezes: the backend that trains the run and
    whether it keeps documents apart."""
    if backend:
        config.train.backend = backend  # the run records the backend it was trained with
    config.train.document_masks = decide_document_masks(config, data, config.train.backend)
    config.freeze()


def resolve_config(config: Config, data: DataInfo) -> Config:
    """A copy of ``config`` completed from the data's shapes and NSP, and the warmup (the caller's is unchanged).

    ``vocab_file`` stays as the user set it: the run records no path of this machine's data folder, which a
    resumed run on another machine would otherwise read (:func:`run_vocab` resolves the one to use).
    """
    resolved = copy.deepcopy(config)
    taken = []
    for key, value in (("max_seq_length", data.max_seq_length),
                       ("max_predictions_per_seq", data.max_predictions_per_seq)):
        if config.get(key) != value:
            if key in config.explicit and config.get(key):  # asked for by name (0: "derive it") and not had
                log.warning("%s=%s was set, but the data in %s was made with %s=%s: the run uses the data's.",
                            key, config.get(key), data.data_dir, key, value)
            else:
                taken.append(f"{key}={value}")
            resolved.set(key, value)
    if taken:
        log.info("%s, from the data in %s.", " and ".join(taken), data.data_dir)
    if data.settings.get("no_nsp"):
        resolved.data.no_nsp = True
    made = data_made_with(config, data)
    by_recipe = {k: v for k, v in made.items() if k in MODERN_RECIPE and k not in config.explicit}
    if by_recipe:  # data made with the other recipe (either family, either recipe): said once, with the way out
        recipe, other = config.data.recipe, "classic" if config.data.recipe == "modern" else "modern"
        log.warning("The data in %s was made with %s, where this run's %s recipe has %s: the run trains on the data "
                    "as it is (and records that); its other settings follow the %s recipe. For one recipe "
                    "throughout, make the data with `create-data --recipe %s`, or train with --recipe %s.",
                    data.data_dir, ", ".join(f"{k}={v!r}" for k, v in by_recipe.items()), recipe,
                    ", ".join(f"{k}={config.get(k)!r}" for k in by_recipe), recipe, recipe, other)
    for key, value in made.items():
        if key not in by_recipe:  # what the user asked for by name, and does not get
            (log.warning if key in config.explicit else log.debug)(
                "The data in %s was made with %s=%r, not %r: the run trains on it as it is, and records that.",
                data.data_dir, key, value, config.get(key))
        resolved.set(key, value, source=f"{data.data_dir}'s manifest")
    t = resolved.train
    if t.num_warmup_steps < 0:
        t.num_warmup_steps = auto_warmup_steps(t.num_train_steps)
        log.info("num_warmup_steps=%d: 10%% of num_train_steps=%d, at most 10,000 (set --num_warmup_steps to "
                 "choose).", t.num_warmup_steps, t.num_train_steps)
    if t.eval_every_steps < 0:
        t.eval_every_steps = auto_eval_every_steps(t.num_train_steps)
        log.info("eval_every_steps=%d: %d evaluations over num_train_steps=%d (about ten, 50 to 1,000 steps apart; "
                 "set --eval_every_steps to choose; 0: at the end only).", t.eval_every_steps,
                 t.num_train_steps // t.eval_every_steps, t.num_train_steps)
    return resolved


def data_made_with(config: Config, data: DataInfo) -> dict:
    """The settings the data was made with (its manifest's) where the configuration says otherwise: what the run's
    config.json must record instead, since the data decides them. A run may still leave NSP out of NSP data, and
    dynamic masking draws its own masks at its own masked_lm_prob."""
    found = {}
    for key in pinned_settings(DATA):
        if key not in data.settings or key in ("max_seq_length", "max_predictions_per_seq"):
            continue
        if (key == "no_nsp" and not data.settings[key]) or (key == "masked_lm_prob" and config.train.dynamic_masking):
            continue
        if config.get(key) != data.settings[key]:
            found[key] = data.settings[key]
    return found


def auto_warmup_steps(num_train_steps: int) -> int:
    """The default warmup: 10% of the run, at most 10,000 steps (BERT's, for its 1M-step run)."""
    return min(10_000, num_train_steps // 10)


def run_vocab(config: Config, data: DataInfo) -> Vocab | None:
    """The vocab a run trains with, read once: the configured file (checked to be the data's), else the data folder's
    own (None when neither); refused when the data folder lost the copy its manifest records."""
    if not config.data.vocab_file and data.lost_vocab:
        raise UserInputError(
            f"The data folder {data.data_dir} lost its {data.lost_vocab}: its manifest records that the data was "
            f"made with it (sha256 {data.vocab_sha256[:12]}...), and a run needs it to read the token ids. Copy it "
            "back there (the --vocab_file given to create-data), or set --vocab_file to it.")
    if config.data.vocab_file:  # a vocab.txt, a tokenizer.json, or a model folder holding one
        vocab = Vocab.read(config.data.vocab_file)
        _check_same_vocab(vocab, data)
        return vocab
    return Vocab.read(data.vocab_file) if data.vocab_file else None


def _check_same_vocab(vocab: Vocab, data: DataInfo) -> None:
    """Refuse a vocab other than the data's, compared token by token (same size, other order: other words)."""
    tokens = vocab.tokens
    if data.vocab_file:
        theirs = Vocab.read(data.vocab_file).tokens
        if tokens == theirs:
            return
        line = next((i for i, (a, b) in enumerate(zip(tokens, theirs, strict=False)) if a != b),
                    min(len(tokens), len(theirs)))
        ours = tokens[line] if line < len(tokens) else "(end of file)"
        other = theirs[line] if line < len(theirs) else "(end of file)"
        detail = f"line {line + 1} is {ours!r} here and {other!r} in the data's {data.vocab_file}"
    elif data.vocab_sha256 and vocab.sha256 != data.vocab_sha256:
        detail = "its checksum differs from the one in the data's manifest"
    elif data.vocab_size and len(tokens) != data.vocab_size:
        detail = f"it has {len(tokens)} tokens, the data's vocab {data.vocab_size}"
    else:
        return
    raise UserInputError(f"vocab_file {vocab.setting} is not the vocab the data in {data.data_dir} was made with "
                         f"({detail}): the token ids would mean other words. Leave vocab_file unset to use the "
                         "data's own vocab.")


def run_model_config(config: Config, data: DataInfo, vocab: Vocab | None,
                     vocab_to_come: bool = False) -> BertConfig | ModernBertConfig:
    """The model's shape of the run's model_family (its record's resolver), checked against the data: MLM-only data
    for a family without NSP, its token ids within the vocab, its length within the positions; a model built from
    model_size records the positions it has. ``vocab_to_come``: planned before the vocab is made (no ``vocab``)."""
    family = family_named(config.model.model_family)
    if not family.has_nsp and not data.settings.get("no_nsp"):
        raise UserInputError(
            f"model_family={family.name} trains the masked LM alone, but the data in {data.data_dir} was made with "
            "next-sentence pairs (no_nsp false: half the second segments are random text): make MLM-only data with "
            "`tpu-pretrain create-data --recipe modern` (packed sequences) or --no_nsp.")
    model_config = family.resolve_shape(shape_request(config, data, vocab, vocab_to_come))
    check_token_ids(data, model_config.vocab_size)
    _say_the_size_trained(config, model_config, family)
    check_positions(config, data, model_config)
    m = config.model
    if not (m.max_position_embeddings or m.bert_config_file or m.init_checkpoint):
        m.max_position_embeddings = model_config.max_position_embeddings
    return model_config


def shape_request(config: Config, data: DataInfo, vocab: Vocab | None, vocab_to_come: bool) -> ShapeRequest:
    """What the settings and the vocab ask of the shape (a vocab to come: the special tokens `tpu-pretrain vocab`
    puts first, when its size is known)."""
    m = config.model
    tokens = vocab.tokens if vocab else (SPECIAL_TOKENS if vocab_to_come and data.vocab_size else None)
    return ShapeRequest(model_size=m.model_size, config_file=m.bert_config_file, init_checkpoint=m.init_checkpoint,
                        vocab_tokens=tokens, vocab_size=len(vocab) if vocab else data.vocab_size,
                        tokenizer_json=bool(vocab and vocab.is_tokenizer_json),
                        vocab_setting=vocab.setting if vocab else "", vocab_source=str(vocab.source) if vocab else "",
                        vocab_to_come=vocab_to_come, max_position_embeddings=m.max_position_embeddings,
                        dropout=m.hidden_dropout_prob, activation=m.hidden_act)


def positions_of_the_run(config: Config) -> None:
    """max_position_embeddings 0 (the family's own) continuing a run: the run's, which may predate ModernBERT's
    8,192 (a changed shape would refuse the resume)."""
    m, output_dir = config.model, config.storage.output_dir
    if m.max_position_embeddings or not output_dir or "://" in output_dir:
        return
    run = RunFolder(output_dir)
    if run.is_run() and run.read_identity():
        try:
            m.max_position_embeddings = run.read_model_config().max_position_embeddings
        except (UserInputError, OSError, ValueError):
            return  # a damaged shape file is said where the run is read


def check_positions(config: Config, data: DataInfo, model_config) -> None:
    """The data's max_seq_length within the model's positions (the data has no limit of its own); the error names
    what fixes it: the flag for a model built from model_size, the file or checkpoint that fixes them otherwise."""
    seq, positions = data.max_seq_length, model_config.max_position_embeddings
    if seq <= positions:
        return
    m = config.model
    where = f" in {data.data_dir}" if data.data_dir else ""
    lower = f"or make the data with --max_seq_length {positions} or less"
    if m.bert_config_file:
        fix = f"raise max_position_embeddings in {m.bert_config_file} to {seq} or more, {lower}"
    elif m.init_checkpoint:
        fix = f"init_checkpoint {m.init_checkpoint} has {positions} positions; {lower}"
    else:
        fix = f"train with --max_position_embeddings {seq} (or more), {lower}"
    raise UserInputError(f"The data{where} has max_seq_length {seq}, above the model's max_position_embeddings "
                         f"{positions}: {fix}.")


def _say_the_size_trained(config: Config, model_config, family: ModelFamily) -> None:
    """A model_size given beside a config file or an init checkpoint of another shape: the file (the weights)
    decides the shape. Said, and the run's config.json records no size it does not train."""
    m = config.model
    shape = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads")
    if not m.model_size or family.named_shape(m.model_size) == tuple(getattr(model_config, k) for k in shape):
        return
    source = f"bert_config_file {m.bert_config_file}" if m.bert_config_file else f"init_checkpoint {m.init_checkpoint}"
    layers, hidden, inner, heads = (getattr(model_config, k) for k in shape)
    log.warning("model_size %s is not the shape of %s (%d layers, hidden %d, intermediate %d, %d heads): that shape "
                "is trained, as its weights decide it; the run's config.json records no model_size. Leave "
                "--model_size out with an init checkpoint.", m.model_size, source, layers, hidden, inner, heads)
    m.model_size = ""


def check_data_fills_a_batch(t: TrainConfig, data: DataInfo) -> None:
    if data.train_instances is not None and data.train_instances < t.train_batch_size:
        raise UserInputError(
            f"The data in {data.data_dir} holds {data.train_instances} training instances, fewer than one batch "
            f"(train_batch_size={t.train_batch_size}): make more data (more text, a higher dupe_factor) or use a "
            "smaller train_batch_size.")
