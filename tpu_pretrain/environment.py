"""What the package takes from the process environment, and what it must set there first.

Keras 2 mode: bert4keras needs Keras 2. TensorFlow 2.16+ defaults to Keras 3, and the choice is fixed the first time
``tf.keras`` is touched, so the environment variables must be set before that. This module has no
heavy imports: importing :mod:`tpu_pretrain` stays fast for the data-preparation steps.

The TPU build: TensorFlow reads its TPU variables when it is imported. On a TPU VM the package sets the PJRT
runtime's variables (TPU v5e needs them); anywhere else, with the TPU build installed, it sets
``TPU_LOAD_LIBRARY=0``, without which ``import tensorflow`` waits on a cloud metadata server that is not there.

Overrides: the few environment variables the package reads that are not settings of ``Config`` are
listed in :data:`ENVIRONMENT_OVERRIDES` and read only through :func:`environment_override`.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from importlib import metadata, util
from pathlib import Path

from .errors import UserInputError
from .pinned_sets import NO_DEPS, pins
from .runtime import tpu_vm_present

BERT4KERAS_VERSION = pins(NO_DEPS)["bert4keras"]  # the package's requirement file names the version
# What TensorFlow's PJRT runtime needs on a TPU v5e (Google's keras-rs TPU CI sets the same).
PJRT_VARIABLES = ("PJRT_DEVICE", "NEXT_PLUGGABLE_DEVICE_USE_C_API", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH")
MLIR_BRIDGE_FLAG = "--tf_mlir_enable_mlir_bridge=true"
# The distributions that install TensorFlow's ``tensorflow`` module (any build).
TENSORFLOW_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tf-nightly")

# Variables that are not settings of Config: each covers a case Config does not (tests, emulators,
# sign-in); docs/layout.md lists them too.
ENVIRONMENT_OVERRIDES = {
    "STORAGE_EMULATOR_HOST": "Send Cloud Storage calls to this emulator (http://host:port) without credentials.",
    "GOOGLE_APPLICATION_CREDENTIALS": "A service-account key file for Cloud Storage (on Kaggle: set from a secret).",
    "GOOGLE_CLOUD_PROJECT": "The project for Cloud Storage calls when the credentials do not name one.",
    "TPU_PRETRAIN_GCS_RETRY_SECONDS": "Bound on the client library's retries of one Cloud Storage metadata call "
                                      "(default 30; uploads and downloads retry on top, transfer_retries times).",
    "TF_CONFIG": "TensorFlow's cluster description for training on several machines (instead of --worker_hosts).",
    "TPU_PRETRAIN_CACHE_DIR": "Where resumable-upload sessions are remembered, corpus URLs are downloaded and the TPU "
                              "environment is built (default ~/.cache/tpu_pretrain).",
    "HF_TOKEN": "A Hugging Face token for pushing an export to the Hub and reading private or gated datasets "
                "(on Colab and Kaggle: a secret of that name).",
    "TPU_PRETRAIN_HUB_MIRROR": "Read hf://datasets/OWNER/NAME inputs from this local folder laid out as the Hub "
                               "(datasets/OWNER/NAME/...) instead of the Hub: an offline copy, and the tests.",
    "TPU_PRETRAIN_ATTENTION": "The JAX model's attention path: auto (default: cuDNN's fused kernel on a GPU in "
                              "bfloat16/float16, XLA's fused attention elsewhere), xla, cudnn, or explicit (matmul, "
                              "softmax, matmul); for comparing them.",
    "TPU_PRETRAIN_LAYERNORM": "The JAX model's LayerNorm: auto (default: two Pallas Triton kernels on a GPU of compute "
                              "capability 8.0+, XLA's norm elsewhere), xla, or pallas (Pallas's interpreter off a "
                              "GPU: tests).",
}


def environment_override(name: str, default: str | None = None) -> str | None:
    """The value of a documented override variable (see :data:`ENVIRONMENT_OVERRIDES`)."""
    if name not in ENVIRONMENT_OVERRIDES:
        raise KeyError(f"{name} is not a documented override; add it to environment.ENVIRONMENT_OVERRIDES")
    value = os.environ.get(name, "").strip()
    return value or default


def override_choice(name: str, choices: tuple[str, ...], what: str, setting: str | None = None) -> str:
    """``setting``, else the override variable ``name``, else the first of ``choices``, lower-cased; a value that is
    not one of ``choices`` is refused, naming the variable."""
    value = (setting or environment_override(name, choices[0])).strip().lower()
    if value not in choices:
        raise UserInputError(f"{what} {value!r} is not one of {', '.join(choices)} ({name}).")
    return value


class EnvironmentSetupError(RuntimeError):
    """The Python environment cannot run bert4keras; the message says how to fix it."""


def configure_keras2() -> None:
    """Select Keras 2 for TensorFlow and bert4keras, or explain why that is no longer possible."""
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    os.environ["TF_KERAS"] = "1"  # bert4keras reads this to use tf.keras instead of standalone keras
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    tf = sys.modules.get("tensorflow")
    if tf is not None and _keras_major(tf) >= 3:
        raise EnvironmentSetupError(
            "TensorFlow was imported in Keras 3 mode before tpu_pretrain, so bert4keras cannot use "
            "Keras 2 in this process. Fix: import tpu_pretrain before tensorflow (or set "
            "TF_USE_LEGACY_KERAS=1 and TF_KERAS=1 before anything imports TensorFlow), then restart "
            "the Python process or notebook kernel."
        )


_AT_IMPORT: dict[str, str | None] | None = None  # the PJRT variables as TensorFlow saw them at its import


def configure_tpu_runtime() -> None:
    """Set TensorFlow's TPU variables before it is imported: PJRT on a TPU VM, TPU_LOAD_LIBRARY=0 elsewhere.

    Only where the TPU build (tensorflow-tpu) is installed; the standard build never loads libtpu. The
    variables as TensorFlow saw them are kept for the diagnosis (:func:`tpu_variables_at_import`).
    """
    global _AT_IMPORT
    before = {name: os.environ.get(name) for name in PJRT_VARIABLES}
    if installed_version("tensorflow-tpu"):
        if tpu_vm_present():
            library = libtpu_library()
            os.environ["PJRT_DEVICE"] = "TPU"
            os.environ["NEXT_PLUGGABLE_DEVICE_USE_C_API"] = "true"
            if library:  # this environment's libtpu, not one another environment (JAX's) announced
                os.environ["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] = os.environ["TPU_LIBRARY_PATH"] = library
            flags = os.environ.get("TF_XLA_FLAGS", "")
            if MLIR_BRIDGE_FLAG not in flags:
                os.environ["TF_XLA_FLAGS"] = f"{flags} {MLIR_BRIDGE_FLAG}".strip()
        else:
            os.environ.setdefault("TPU_LOAD_LIBRARY", "0")
    if _AT_IMPORT is None:
        _AT_IMPORT = before if "tensorflow" in sys.modules else {name: os.environ.get(name) for name in PJRT_VARIABLES}


def tpu_variables_at_import() -> dict[str, str | None]:
    """The PJRT variables as they were when TensorFlow was imported (before tpu_pretrain, if it came first)."""
    return dict(_AT_IMPORT or {name: os.environ.get(name) for name in PJRT_VARIABLES})


def libtpu_library() -> str | None:
    """This environment's ``libtpu/libtpu.so`` (found without importing libtpu), or None."""
    spec = util.find_spec("libtpu")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "libtpu.so"
    return str(path) if path.is_file() else None


def _keras_major(tf) -> int:
    """Major version of the Keras behind ``tf.keras`` (touching it fixes TensorFlow's choice)."""
    try:
        layer_module = tf.keras.layers.Layer.__module__
    except Exception:  # pragma: no cover - tf.keras missing entirely
        return 3
    return 2 if layer_module.startswith("tf_keras") else 3


def check_dependencies() -> None:
    """Fail early, with the install command, when TensorFlow, tf-keras or bert4keras is missing or mismatched."""
    problems = []
    tf_version = installed_version(*TENSORFLOW_DISTRIBUTIONS)
    tfk_version = installed_version("tf-keras")
    # Beside the TPU build, tf-keras goes in without its dependency on the standard `tensorflow` wheel.
    no_deps = "--no-deps " if installed_version("tensorflow-tpu") else ""
    if not tf_version:
        problems.append("TensorFlow is not installed: pip install 'tpu_pretrain[cpu]' (the CPU/GPU build); on a TPU "
                        "VM, train through tpu_pretrain.tf_backend.setup.tpu_env, which makes the TPU build's own "
                        "environment")
    elif not tfk_version:
        problems.append(f"tf-keras is missing: pip install {no_deps}'tf-keras=={minor_version(tf_version)}.*'")
    elif minor_version(tf_version) != minor_version(tfk_version):
        problems.append(
            f"tf-keras {tfk_version} does not match TensorFlow {tf_version}: "
            f"pip install {no_deps}'tf-keras=={minor_version(tf_version)}.*'"
        )
    b4k_version = installed_version("bert4keras")
    if b4k_version != BERT4KERAS_VERSION:
        found = f"bert4keras {b4k_version} is installed" if b4k_version else "bert4keras is missing"
        problems.append(
            f"{found}; tpu_pretrain needs {BERT4KERAS_VERSION}: "
            f"pip install --no-deps 'bert4keras=={BERT4KERAS_VERSION}' (--no-deps because it pins an "
            "ancient keras)"
        )
    if problems:
        raise EnvironmentSetupError("; ".join(problems))


def installed_version(*names: str) -> str | None:
    """The version of the first of these distributions that is installed, or None."""
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def minor_version(version: str) -> str:
    """``2.19`` of ``2.19.1``: tf-keras must match TensorFlow to this precision."""
    return ".".join(version.split(".")[:2])


# TensorFlow's C++ start-up lines that are not the user's business on a machine without the hardware they
# mention (written to the process's stderr before Python's logging can filter anything).
NATIVE_NOISE = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|cudart_stub\.cc.*Could not find cuda drivers"
    r"|failed call to cuInit"
    r"|Unable to register cu(DNN|FFT|BLAS) factory"
    r"|computation placer already registered"
    r"|oneDNN custom operations are on"
    r"|This TensorFlow binary is optimized to use available CPU instructions"
    r"|To enable the following instructions: .* in other operations, rebuild TensorFlow"
    r"|TF-TRT Warning: Could not find TensorRT")


@contextlib.contextmanager
def native_stderr_filtered(noise: re.Pattern = NATIVE_NOISE):
    """Hold what is written to file descriptor 2 during the block, then pass on every line but the noise."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real stderr (some notebook front ends): nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().decode("utf-8", "replace").splitlines(keepends=True)
                    if not noise.search(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def import_tensorflow():
    """TensorFlow, imported (and its devices listed, off TPU VMs) with the C++ start-up noise filtered out.

    Where it is not installed, the error says how to install it (:func:`check_dependencies`).
    """
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    if util.find_spec("tensorflow") is None:
        check_dependencies()
    with native_stderr_filtered():
        import tensorflow as tf

        if not tpu_vm_present():  # the CUDA probe ("failed call to cuInit") happens here, not mid-run
            tf.config.list_physical_devices()
    return tf
