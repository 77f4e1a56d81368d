"""Which training backend this runtime uses: TensorFlow with bert4keras, or Keras 3 on JAX.

Both train the same model from the same data into the same run folder (:mod:`.core`). JAX is the path of
the free TPUs: Colab's TPU image has no TensorFlow, and Kaggle's ``tensorflow-cpu`` cannot see the TPU.
The choice reads installed distributions and the machine, and imports neither framework, so a notebook
can make it before installing anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .environment import BERT4KERAS_VERSION, TENSORFLOW_DISTRIBUTIONS, installed_version
from .errors import UserInputError
from .models.families import FAMILIES
from .runtime import tpu_vm_present

TENSORFLOW, JAX, AUTO = "tensorflow", "jax", "auto"
BACKENDS = (TENSORFLOW, JAX)
# TensorFlow distributions that can drive a TPU (the plain and -cpu builds cannot).
TPU_TENSORFLOW = ("tensorflow-tpu",)


def tensorflow_installed() -> bool:
    """TensorFlow, tf-keras and the pinned bert4keras are all installed (what the TensorFlow backend needs)."""
    return bool(installed_version(*TENSORFLOW_DISTRIBUTIONS) and installed_version("tf-keras")
                and installed_version("bert4keras") == BERT4KERAS_VERSION)


def jax_installed() -> bool:
    return bool(installed_version("jax") and installed_version("keras"))


def choose_backend(requested: str = AUTO) -> tuple[str, str]:
    """``(backend, why)`` for ``requested`` (``tensorflow``, ``jax`` or ``auto``) on this machine.

    ``auto`` takes JAX on a TPU VM without a TPU build of TensorFlow (``tensorflow-tpu``), and wherever
    TensorFlow, tf-keras or bert4keras is missing; TensorFlow otherwise. An explicit choice is checked
    against what is installed, with the install command when something is missing.
    """
    if requested == JAX:
        if not jax_installed():
            raise UserInputError("backend=jax needs JAX and Keras 3: pip install 'tpu_pretrain[jax]' (or "
                                 "pip install jax keras; on a TPU VM: pip install 'jax[tpu]' keras).")
        return JAX, "requested"
    if requested == TENSORFLOW:
        if not tensorflow_installed():
            raise UserInputError(
                "backend=tensorflow needs TensorFlow, the matching tf-keras and bert4keras " + BERT4KERAS_VERSION
                + " (make install, or pip install tensorflow tf-keras && pip install --no-deps bert4keras=="
                + BERT4KERAS_VERSION + "); or train with --backend jax, which needs neither.")
        return TENSORFLOW, "requested"
    if requested != AUTO:
        raise UserInputError(f"backend={requested!r}: choose tensorflow, jax or auto.")
    if tpu_vm_present() and not installed_version(*TPU_TENSORFLOW) and jax_installed():
        return JAX, "a TPU VM whose TensorFlow (if any) cannot use the TPU; JAX can, with no TensorFlow install"
    if not tensorflow_installed() and jax_installed():
        return JAX, "TensorFlow, tf-keras or bert4keras is not installed here; JAX and Keras 3 are"
    if not tensorflow_installed():
        raise UserInputError("Neither backend is installed: pip install 'tpu_pretrain[jax]' (Keras 3 on JAX), or "
                             "'tpu_pretrain[cpu]' (TensorFlow; '[gpu]' is the same set) and then pip install --no-deps "
                             f"bert4keras=={BERT4KERAS_VERSION}.")
    return TENSORFLOW, "TensorFlow with bert4keras is installed and can use this machine"


@dataclass(frozen=True)
class Offer:
    """A setting (at some values) that only some backends offer."""

    setting: str
    used: Callable[[object], bool]  # whether the setting's value asks for the feature
    backends: tuple[str, ...]
    what: str
    picks_auto: bool = False  # ``--backend auto`` takes the backend that offers it (else: the machine's, refused)


# What each backend offers beyond what both do: the one table that settings validation reads, before any data.
OFFERS = (
    # Each backend trains on several machines, each its own way: TensorFlow's workers, or JAX's runtime (below).
    Offer("worker_hosts", bool, (TENSORFLOW,), "training on several machines with TensorFlow's workers"),
    Offer("task_index", bool, (TENSORFLOW,), "training on several machines with TensorFlow's workers"),
    # JAX's own multi-process runtime (jax.distributed): a TPU VM pod's hosts, or several GPU machines.
    Offer("coordinator_address", bool, (JAX,), "training on several machines with JAX's runtime"),
    Offer("num_processes", lambda n: n > 1, (JAX,), "training on several machines with JAX's runtime"),
    Offer("process_index", bool, (JAX,), "training on several machines with JAX's runtime"),
    Offer("tpu_name", lambda name: name != "local", (TENSORFLOW,), "a TPU reached by name or address"),
    Offer("jit_compile", lambda mode: mode == "off", (TENSORFLOW,), "training without XLA"),
    # The TensorFlow backend's attention has no document masks: "on" would train without them and record "on".
    Offer("document_masks", lambda mode: mode == "on", (JAX,),
          "the documents of packed rows kept apart; the TensorFlow backend's attention has no document masks"),
    # A family one backend alone builds (ModernBERT): no machine makes the other backend right for it.
    *(Offer("model_family", lambda name, family=family: name == family.name, family.backends, family.title,
            picks_auto=True) for family in FAMILIES.values() if set(family.backends) != set(BACKENDS)),
)


def _used_offers(settings) -> list[tuple[Offer, object]]:
    """The offers ``settings`` ask for, with their values: a whole :class:`.config.Config`, or one of its sections
    (whose other sections' settings are not asked for)."""
    used = []
    for offer in OFFERS:
        value = settings.get(offer.setting) if hasattr(settings, "explicit") else getattr(settings, offer.setting, None)
        if value is not None and offer.used(value):
            used.append((offer, value))
    return used


def required_backend(settings) -> tuple[str, str] | None:
    """``(backend, why)`` where the settings ask for something one backend alone offers and that decides
    ``--backend auto`` (a model family: no machine makes the other backend right for it), else None."""
    for offer, value in _used_offers(settings):
        if offer.picks_auto and len(offer.backends) == 1:
            return offer.backends[0], f"{offer.setting}={value!r} ({offer.what}) is offered by it alone"
    return None


def run_backend(requested: str, recorded: str | None = None, config=None) -> tuple[str, str]:
    """``(backend, why)`` for a run: with ``auto`` (or that same backend, read back from the run's config.json on
    resume), the backend ``recorded`` for the run already in its folder; with ``auto`` and no run, the one backend
    that offers what ``config`` asks for (:func:`required_backend`), else the machine's (:func:`choose_backend`)."""
    if recorded and requested in (AUTO, recorded):  # a resumed run's config.json names it: nobody asked anew
        choose_backend(recorded)  # installed here?
        return recorded, "the backend this run was started with"
    required = required_backend(config) if requested == AUTO and config is not None else None
    if required:
        choose_backend(required[0])  # installed here?
        return required
    return choose_backend(requested)


def check_offered(backend: str, settings, set_by: dict[str, str] | None = None) -> None:
    """Refuse a setting that ``backend`` does not offer, naming the setting, who set it (``set_by``: a recipe) and
    the backend that has it. ``settings``: a :class:`.config.Config` or its ``train`` section."""
    for offer, value in _used_offers(settings):
        if backend not in offer.backends:
            source = (set_by or {}).get(offer.setting)
            origin = f", set by {source}" if source else ""
            unset = (f"give --{offer.setting} another value (it wins over the recipe)" if source
                     else f"leave {offer.setting} unset")
            raise UserInputError(
                f"{offer.setting}={value!r} ({offer.what}{origin}) is offered by the {' and '.join(offer.backends)} "
                f"backend, not {backend}: train with --backend {offer.backends[0]}, or {unset}.")
