"""What the notebooks call, so that no logic lives in a notebook cell.

- ``runtime_setup``: ``prepare_runtime(globals(), needs=...)``, the one call after the parameters cell that
  makes a fresh Colab, Kaggle or Jupyter runtime ready (parameters checked, stack installed where missing,
  Drive mounted, Cloud Storage signed in to).
- ``params``: the parameters cell read once, placeholders refused.
- ``places``: the durable places a notebook reads and writes (Drive, Cloud Storage, Kaggle output and
  inputs) and its local scratch space.
- ``steps``: train, evaluate and export as ``tpu-pretrain`` processes of their own, streamed into the cell
  (training with live curves), so no notebook kernel imports TensorFlow.
- ``progress``: a training process's progress in the cell: a bar from the first step reported, without tqdm's
  own rate and ETA, and the run's own line (loss, learning rate, sequences/s, MFU, ETA, durable step) in full.
- ``views``: the runtime, decoded instances with their masks highlighted, a run's status and curves.
- ``checks``: 00_setup's checks of the accelerator (the TPU probe) and of the durable folder.
- ``results``: fill-mask through ``transformers``, a zip to download, a push to the Hugging Face Hub.
- ``keep_alive``: the Colab keep-alive script, offered honestly.
"""

from ..runtime import runtime
from . import places
from .checks import check_accelerator, check_project
from .keep_alive import keep_alive_instructions, keep_alive_script
from .params import Parameters, parameters
from .places import corpus_files, save
from .results import fill_mask_with_transformers, offer_download, push_to_hub, zip_folder
from .runtime_setup import prepare_runtime
from .steps import evaluate, export, fetch_run, run_or_raise, train
from .views import describe_runtime, nvidia_gpus, show_curves, show_instances, status, tensorboard

__all__ = ["Parameters", "check_accelerator", "check_project", "corpus_files", "describe_runtime", "evaluate",
           "export", "fetch_run", "fill_mask_with_transformers", "keep_alive_instructions", "keep_alive_script",
           "nvidia_gpus", "offer_download", "parameters", "places", "prepare_runtime", "push_to_hub", "run_or_raise",
           "runtime", "save", "show_curves", "show_instances", "status", "tensorboard", "train", "zip_folder"]
