"""One typed configuration for every step (:class:`Config`): built from keywords, files or flags, checked, saved.

The settings themselves, their sections and the recipes are declared in :mod:`.settings`; this module is the
machinery over them: a setting set by its flat name, the recipe applied around the settings given by name, the
queries the CLI and the run folder ask (:func:`step_settings`, :func:`pinned_settings`) and the messages for an
unknown setting. Every declaration is importable from here too, as it always was.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import logging
import os
import typing
from dataclasses import dataclass, field
from typing import Any

from .config_checks import ConfigError, check_settings, checkpoint_family, coerce, read_config_file
from .models.families import MODERNBERT, family_named
from .settings import (
    CORPUS_STEPS,
    CREATE_DATA,
    DATA,
    DEMO,
    EVALUATE,
    MODERN_RECIPE,
    RUN,
    SECTIONS,
    STORAGE_CHECK,
    TRAIN,
    TRANSFER,
    VOCAB,
    CorpusConfig,
    ModelConfig,
    PretrainingDataConfig,
    StorageConfig,
    TrainConfig,
    VocabConfig,
)

# The declarations, importable from here as they always were (``from tpu_pretrain.config import TRAIN, ...``).
__all__ = ["CORPUS_STEPS", "CREATE_DATA", "DATA", "DEMO", "EVALUATE", "MODERN_RECIPE", "RUN", "SECTIONS",
           "STORAGE_CHECK", "TRAIN", "TRANSFER", "VOCAB", "Config", "ConfigError", "CorpusConfig", "ModelConfig",
           "PretrainingDataConfig", "StorageConfig", "TrainConfig", "VocabConfig", "all_fields", "field_type",
           "pinned_settings", "step_settings", "unknown_key_message"]
log = logging.getLogger(__name__)


@dataclass
class Config:
    """The whole configuration; build it with :meth:`from_kwargs`, :meth:`from_file` or :meth:`load`.

    ``explicit`` records the settings given by name (flag, file, keyword): a recipe never overrides them.
    """

    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    vocab: VocabConfig = field(default_factory=VocabConfig)
    data: PretrainingDataConfig = field(default_factory=PretrainingDataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    explicit: set[str] = field(default_factory=set, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.apply_recipe()  # the default recipe (modern) sets its settings, as a recipe given by name would

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> Config:
        """Flat keyword arguments (``max_seq_length=128``) or section dicts (``data={...}``)."""
        return cls.from_dict(kwargs)

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "configuration") -> Config:
        config = cls()
        config.update(values, source=source)
        return config

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> Config:
        return cls.from_dict(read_config_file(path), source=str(path))

    @classmethod
    def load(cls, path: str | os.PathLike | None = None, **overrides: Any) -> Config:
        """A file's settings (if any), then keyword overrides, validated."""
        config = cls.from_file(path) if path else cls()
        config.update(overrides)
        config.validate()
        return config

    def update(self, values: dict[str, Any], source: str = "configuration") -> None:
        for key, value in values.items():
            if key in SECTIONS and isinstance(value, dict):
                for sub_key, sub_value in value.items():
                    if sub_key in _FIELD_SECTION and _FIELD_SECTION[sub_key] != key:
                        raise ConfigError(
                            f"Setting '{sub_key}' in {source} is under section '{key}', but it belongs to section "
                            f"'{_FIELD_SECTION[sub_key]}': move it there (or to the top level).")
                    if sub_key not in _FIELD_SECTION:
                        raise ConfigError(unknown_key_message(sub_key, source, section=key))
                    self.set(sub_key, sub_value, source)
            else:
                self.set(key, value, source)

    def set(self, key: str, value: Any, source: str = "configuration") -> None:
        section = _FIELD_SECTION.get(key)
        if section is None:
            raise ConfigError(unknown_key_message(key, source))
        choices = all_fields()[key].metadata.get("choices")
        setattr(getattr(self, section), key, coerce(key, value, _FIELD_TYPES[key], choices, source))
        self.explicit.add(key)
        if key in ("model_family", "init_checkpoint") and "recipe" not in self.explicit:
            self.data.recipe = default_recipe(self.model.model_family, self.model.init_checkpoint)
        if key in ("recipe", "model_family", "init_checkpoint"):
            self.apply_recipe()
        if key in ("init_checkpoint", "bert_config_file") and "model_family" not in self.explicit:
            self._family_of_checkpoint(key)

    def _family_of_checkpoint(self, setting: str) -> None:
        """``model_family`` from what a checkpoint (or config file) is, by its config.json's model_type, as
        ``--model_family`` would set it (recipe included); one given by name is checked against it instead."""
        family = checkpoint_family(self.get(setting))
        if family is not None and family != self.model.model_family:
            self.set("model_family", family, source=f"{setting} {self.get(setting)}")
            log.info("model_family=%s, from %s %s (its config.json's model_type).", family, setting, self.get(setting))

    def apply_recipe(self) -> None:
        """Set what the recipe sets, except the settings given explicitly."""
        fields = all_fields()
        for key, modern in MODERN_RECIPE.items():
            if key not in self.explicit:
                value = modern if self.data.recipe == "modern" else fields[key].default
                setattr(getattr(self, _FIELD_SECTION[key]), key, value)

    def get(self, key: str) -> Any:
        if key not in _FIELD_SECTION:
            raise ConfigError(unknown_key_message(key, "configuration"))
        return getattr(getattr(self, _FIELD_SECTION[key]), key)

    # -- a resolved run's settings --------------------------------------------------------------
    def freeze(self) -> Config:
        """Refuse every later assignment (the resolver's last act: :mod:`.core.resolve`); returns ``self``."""
        for name in SECTIONS:
            object.__setattr__(getattr(self, name), "_frozen", True)
        return self

    @property
    def frozen(self) -> bool:
        return self.train._frozen

    def __deepcopy__(self, memo: dict) -> Config:
        """A copy is a configuration being built: editable, whether or not this one is frozen."""
        copied = Config.__new__(Config)
        for f in dataclasses.fields(self):
            value = copy.deepcopy(getattr(self, f.name), memo)
            if f.name in SECTIONS:
                vars(value).pop("_frozen", None)
            object.__setattr__(copied, f.name, value)
        return copied

    def replaced(self, source: str = "the run's plan", **settings: Any) -> Config:
        """A frozen copy with ``settings`` set (a new plan's settings: this one is unchanged)."""
        copied = copy.deepcopy(self)
        copied.update(settings, source=source)
        return copied.freeze()

    # -- output -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}

    def flat(self) -> dict[str, Any]:
        return {key: value for section in self.to_dict().values() for key, value in section.items()}

    def given(self) -> dict[str, Any]:
        """The settings a Python caller's config gives: those set by name, and any it changed from what those imply
        (an attribute assigned directly)."""
        given = {key: self.get(key) for key in self.explicit}
        implied = Config.from_dict(given).flat()
        return {**given, **{key: value for key, value in self.flat().items() if value != implied[key]}}

    def save(self, path: str | os.PathLike) -> None:
        """Write the resolved configuration as JSON (atomically: a reader never sees half a file)."""
        from .storage.local import write_text_atomic

        write_text_atomic(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    # -- validation ---------------------------------------------------------------------------
    def validate(self) -> Config:
        """Check each setting and the consistency between them; raise :class:`ConfigError` naming setting and fix."""
        check_settings(self)
        return self


def default_recipe(model_family: str, init_checkpoint: str) -> str:
    """Modern from scratch (and for ModernBERT); classic where a BERT init_checkpoint (a Google or Hugging Face
    release) is continued the way it was trained."""
    if family_named(model_family) is MODERNBERT or not init_checkpoint:
        return "modern"
    # a transformers ModernBERT folder is continued the modern way
    return "modern" if checkpoint_family(init_checkpoint) == MODERNBERT.name else "classic"


def recipe_line(config: Config) -> str:
    """The one line ``train`` and ``create-data`` start with: the recipe, why it is the one, how to change it."""
    recipe, other = config.data.recipe, "classic" if config.data.recipe == "modern" else "modern"
    if "recipe" in config.explicit:
        why = "as configured"
    elif family_named(config.model.model_family) is MODERNBERT:
        why, other = "ModernBERT's", ""
    elif recipe == "classic":
        why = f"the default when continuing init_checkpoint {config.model.init_checkpoint}, as it was trained"
    else:
        why = "the default for training from scratch"
    change = f"; --recipe {other} for {RECIPE_NAMES[other]}" if other else ""
    return f"Recipe: {recipe} ({why}: {RECIPE_NAMES[recipe]}){change}."


def recipe_settings(config: Config) -> dict[str, str]:
    """The settings a recipe set (not given by name), with where they came from, for messages about them."""
    if config.data.recipe != "modern":
        return {}
    source = ("--recipe modern" if "recipe" in config.explicit else "--model_family modernbert"
              if family_named(config.model.model_family) is MODERNBERT else "the default recipe, modern")
    return {key: source for key in MODERN_RECIPE if key not in config.explicit}


RECIPE_NAMES = {"modern": "packed MLM-only sequences, 30% masking, no dropout, AdamW beta2 0.98, warmup-stable-decay",
                "classic": "Google's BERT recipe, with next-sentence pairs"}


def all_fields() -> dict[str, dataclasses.Field]:
    """Every setting by name, in section order."""
    return {f.name: f for section in SECTIONS.values() for f in dataclasses.fields(section)}


def step_settings(step: str) -> tuple[str, ...]:
    """The settings a step takes (its CLI flags), in section order."""
    return tuple(name for name, f in all_fields().items() if step in f.metadata["steps"])


def pinned_settings(what: str) -> tuple[str, ...]:
    """The settings that pin the data (``DATA``: they shape the shards) or a run (``RUN``: its checkpoints)."""
    return tuple(name for name, f in all_fields().items() if what in f.metadata["pins"])


_FIELD_SECTION: dict[str, str] = {f.name: name for name, sec in SECTIONS.items() for f in dataclasses.fields(sec)}
assert len(_FIELD_SECTION) == sum(len(dataclasses.fields(s)) for s in SECTIONS.values()), "duplicate names"
_FIELD_TYPES: dict[str, Any] = {f.name: typing.get_type_hints(section)[f.name]
                                for section in SECTIONS.values() for f in dataclasses.fields(section)}


def field_type(key: str) -> Any:
    return _FIELD_TYPES[key]


def unknown_key_message(key: str, source: str, section: str | None = None) -> str:
    candidates = list(_FIELD_SECTION) + list(SECTIONS)
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    where = f" in section '{section}'" if section else ""
    hint = f" Did you mean '{close[0]}'?" if close else " See `tpu-pretrain <step> --help` for the settings."
    return f"Unknown setting '{key}'{where} in {source}.{hint}"
