"""Export a trained model for use elsewhere: a Hugging Face folder, or Google's original TF checkpoint.

Both formats start from one dict of weights under Google's BERT names, asked of :mod:`.rebuild` whichever
backend trained the run (a JAX run's are read with NumPy; a TensorFlow run's are mapped by its model);
the renaming both ways lives in :mod:`..models.weight_names`, so an export imports back unchanged and is the
same whichever backend trained the model. Neither writer needs torch, transformers or a TF1 session; the
Hugging Face export of a JAX run needs neither TensorFlow nor JAX. A ModernBERT run's weights keep transformers'
names: it exports as a transformers ``ModernBertForMaskedLM`` folder (:mod:`.hf_modernbert`), and only so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import numpy as np

from ..core.run_folder import RunFolder
from ..environment import import_tensorflow
from ..errors import UserInputError
from ..models.bert_config import BertConfig
from ..models.inference import InferenceModel
from ..models.modernbert_config import ModernBertConfig
from ..models.weight_names import google_to_huggingface, write_safetensors
from . import FORMATS, HEADS
from .folder import check_export_destination, write_export_folder, write_tokenizer_files
from .hf_modernbert import write_modernbert_folder
from .rebuild import TrainedModel, load_trained_model, run_google_weights


# -- Hugging Face folder ----------------------------------------------------------------------------
def huggingface_config(config: BertConfig, architecture: str) -> dict:
    """A transformers ``config.json`` for BERT."""
    return {
        "architectures": [architecture],
        "model_type": "bert",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "intermediate_size": config.intermediate_size,
        "hidden_act": config.hidden_act,
        "hidden_dropout_prob": config.hidden_dropout_prob,
        "attention_probs_dropout_prob": config.attention_probs_dropout_prob,
        "max_position_embeddings": config.max_position_embeddings,
        "type_vocab_size": config.type_vocab_size,
        "initializer_range": config.initializer_range,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }


def export_huggingface(model: InferenceModel, output_dir: str | os.PathLike, vocab_file: str,
                       do_lower_case: bool = True, heads: str = "all", skip=()) -> Path:
    """A Hugging Face folder of a built model of either backend (see :func:`write_huggingface`; a ModernBERT:
    :func:`.hf_modernbert.write_modernbert_folder`)."""
    if isinstance(model.config, ModernBertConfig):
        check_modernbert_export("hf", heads)
        return write_modernbert_folder(model.stored_weights(skip), model.config, output_dir, vocab_file=vocab_file,
                                       do_lower_case=do_lower_case)
    return write_huggingface(model.stored_weights(skip), model.config, output_dir, vocab_file, do_lower_case, heads)


def write_huggingface(google: dict[str, np.ndarray], config: BertConfig, output_dir: str | os.PathLike,
                      vocab_file: str, do_lower_case: bool = True, heads: str = "all") -> Path:
    """A Hugging Face BERT folder; ``heads`` picks the class that loads it without missing/unused weights.

    ``all``: MLM head (+ pooler and NSP head if trained) for ``BertForPreTraining`` (``BertForMaskedLM``
    without NSP); ``mlm``: MLM head only, for ``BertForMaskedLM``; ``encoder``: for ``BertModel``.
    The MLM decoder is tied to the word embeddings, so (as transformers itself saves it) only its bias
    is stored, as ``cls.predictions.bias``. Weights named in ``skip`` (never trained: a head that the
    imported checkpoint lacked) are left out rather than exported as if they were learnt.
    """
    if heads not in HEADS:
        raise UserInputError(f"heads={heads!r}: choose one of {', '.join(HEADS)}.")
    weights = google_to_huggingface(google)
    if heads == "mlm" and "cls.predictions.bias" not in weights:
        raise UserInputError("heads=mlm: this model has no trained MLM head; export heads=encoder.")
    if heads == "mlm":
        weights = {k: v for k, v in weights.items() if not k.startswith(("bert.pooler.", "cls.seq_relationship."))}
    elif heads == "encoder":
        weights = {k: v for k, v in weights.items() if not k.startswith("cls.")}
    if not any(k.startswith("cls.predictions.") for k in weights):
        architecture = "BertModel"
    elif "cls.seq_relationship.weight" in weights:
        architecture = "BertForPreTraining"
    else:
        architecture = "BertForMaskedLM"

    def write(folder: Path) -> None:
        write_safetensors(folder / "model.safetensors", weights, {"format": "pt"})
        (folder / "config.json").write_text(
            json.dumps(huggingface_config(config, architecture), indent=2) + "\n")
        write_tokenizer_files(folder, vocab_file, do_lower_case, config.max_position_embeddings)

    return write_export_folder(output_dir, write, "hf")


# -- Google's original TF checkpoint ------------------------------------------------------------------
def write_tf_checkpoint(prefix: str, weights: dict[str, np.ndarray]) -> None:
    """A name-based TF checkpoint (``.index`` + ``.data``) with exactly these variable names, in eager mode."""
    tf = import_tensorflow()

    names = sorted(weights)
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[tf.constant(weights[n], tf.float32) for n in names])
    name = os.path.basename(prefix)
    Path(prefix).with_name("checkpoint").write_text(
        f'model_checkpoint_path: "{name}"\nall_model_checkpoint_paths: "{name}"\n')


def write_google_checkpoint(weights: dict[str, np.ndarray], config: BertConfig, output_dir: str | os.PathLike,
                            vocab_file: str) -> Path:
    """Google-named weights as ``bert_model.ckpt`` (written with TensorFlow), ``bert_config.json``, ``vocab.txt``."""
    if importlib.util.find_spec("tensorflow") is None:  # checked without importing it (its start-up noise)
        raise UserInputError("format=tf writes a TensorFlow checkpoint and needs TensorFlow (pip install tensorflow); "
                             "format=hf needs only NumPy.")

    def write(folder: Path) -> None:
        write_tf_checkpoint(str(folder / "bert_model.ckpt"), weights)
        config.to_json_file(folder / "bert_config.json")
        shutil.copyfile(vocab_file, folder / "vocab.txt")

    return write_export_folder(output_dir, write, "tf")


# -- runs ----------------------------------------------------------------------------------------------
def export(source: str | os.PathLike, format: str = "hf", output_dir: str | os.PathLike | None = None,
           checkpoint: str | None = None, heads: str = "all", trained: TrainedModel | None = None,
           backend: str | None = None) -> Path:
    """Export a run (newest or chosen weights) or convert a Google/HF checkpoint: ``export(RUN, "hf")``.

    The default destination is ``RUN/export/hf`` or ``RUN/export/tf``; a checkpoint that is not a run
    needs ``output_dir``. A run's weights are read by Google name (no model is built, except the TensorFlow
    one that maps a TensorFlow checkpoint's names); a released checkpoint is loaded into a model of
    ``backend`` (default: one installed) so that what the model does not take is left out.
    """
    if format not in FORMATS:
        raise UserInputError(f"format={format!r}: choose hf (Hugging Face) or tf (Google's original checkpoint).")
    if not os.path.exists(source) and not os.path.isfile(f"{source}.index"):
        raise UserInputError(f"{source} does not exist: give a run folder (train's output_dir), a Hugging Face "
                             "folder or a Google checkpoint prefix.")
    run = RunFolder(source)
    run.check_not_damaged()
    if output_dir is None:
        if not run.is_run():
            raise UserInputError(f"{source} is not a run folder: say where the export goes (--output).")
        output_dir = run.export_dir(format)
    check_export_destination(output_dir)  # before the slow work
    if run.is_run() and isinstance(run.read_model_config(), ModernBertConfig):
        check_modernbert_export(format, heads)
    if trained is None and run.is_run():
        weights, model_config, vocab, lower = run_google_weights(source, checkpoint)
    else:
        trained = trained or load_trained_model(source, checkpoint, backend=backend)
        weights, model_config = trained.stored_weights(), trained.model.config
        vocab, lower = trained.vocab_file, trained.do_lower_case
    if isinstance(model_config, ModernBertConfig):
        check_modernbert_export(format, heads)
        return write_modernbert_folder(weights, model_config, output_dir, vocab_file=vocab, do_lower_case=lower)
    if format == "hf":
        return write_huggingface(weights, model_config, output_dir, vocab, lower, heads)
    return write_google_checkpoint(weights, model_config, output_dir, vocab)


def check_modernbert_export(format: str, heads: str) -> None:
    """A ModernBERT exports as a transformers folder of ``ModernBertForMaskedLM`` (its encoder loads from it with
    ``AutoModel``): Google's checkpoint format, and BERT's choice of heads, have no place for it."""
    if format != "hf":
        raise UserInputError(f"format={format}: Google's BERT checkpoint (bert_model.ckpt) has no place for a "
                             "ModernBERT; export this ModernBERT run with --format hf (a transformers folder).")
    if heads != "all":
        raise UserInputError(f"heads={heads}: a ModernBERT exports as ModernBertForMaskedLM, whole (AutoModel loads "
                             "its encoder from that folder); leave --heads unset.")
