"""Every setting, declared once: its section, type, default, help, the steps that take it and what it pins.

The CLI flags, the notebooks' ``parameters`` cells and the Python API all use these field names.
Where Google's original BERT scripts had a flag, its name is kept so users of the old tutorials
find their way. Field names are unique across sections, so a flat mapping is unambiguous.

Each setting carries two tags: the steps that take it (which decides the flags each ``tpu-pretrain`` subcommand
offers) and what it pins: ``data`` settings shape the bytes of the shards (create-data refuses to mix them in one
folder), ``run`` settings shape a run's checkpoints (train refuses to continue a run with other values). Only
declarations live here; :mod:`.config` builds, reads and checks a :class:`.config.Config` from them. A ``launch``
setting says which process of a launch this is, not what the run is: a run continued in its folder does not take it
from the run's config.json.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError, dataclass, field
from typing import Any

from .models.bert_config import BERT_ACTIVATIONS
from .models.families import BERT, FAMILIES

# The steps (subcommands) a setting can belong to.
VOCAB, CREATE_DATA, TRAIN, EVALUATE, TRANSFER, STORAGE_CHECK, DEMO = (
    "vocab", "create-data", "train", "evaluate", "transfer", "storage-check", "demo")
CORPUS_STEPS = (VOCAB, CREATE_DATA)
# What a setting pins.
DATA, RUN = "data", "run"


class Section:
    """What every section of settings shares: once a run is resolved (:meth:`.config.Config.freeze`) its settings
    refuse assignment, so nothing after the resolver (:mod:`.core.resolve`) changes what the run is."""

    _frozen = False

    def __setattr__(self, name: str, value: Any) -> None:
        if self._frozen:
            raise FrozenInstanceError(f"cannot assign {type(self).__name__}.{name}: the run's settings are resolved "
                                      "and frozen; a changed run is a new plan (tpu_pretrain.core.resolve)")
        super().__setattr__(name, value)


def _f(default, help_text: str, steps: tuple[str, ...] = (), pins: tuple[str, ...] = (), **kwargs):
    metadata = {"help": help_text, "steps": steps, "pins": pins, **kwargs}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class CorpusConfig(Section):
    """How raw text is read and normalised."""

    input: list[str] = _f([], "Corpus files, globs, folders or URLs (.txt; gzip, bzip2, xz, zip; .parquet, a row a "
                          "document: 'f.parquet?column=body'), or a Hub dataset, streamed: 'hf://datasets/OWNER/NAME"
                          "[@REV][/CONFIG][?split=train&column=text]'. URLs are fetched once into the cache; append "
                          "#sha256=<hex> to check the file.", steps=CORPUS_STEPS)
    encoding: str = _f("utf-8", "Text encoding of the corpus files (e.g. latin-1, cp1252, gbk).",
                       steps=CORPUS_STEPS, pins=(DATA,))
    doc_separator: str = _f("", "A line that separates documents (e.g. '%'); blank lines always do.",
                            steps=CORPUS_STEPS, pins=(DATA,))
    split_sentences: bool = _f(False, "Split lines holding a paragraph into sentences (English, Chinese).",
                               steps=(CREATE_DATA,), pins=(DATA,))
    unicode_normalization: str = _f("NFKC", "Unicode normal form: NFKC, NFC or none.", choices=("NFKC", "NFC", "none"),
                                    steps=CORPUS_STEPS, pins=(DATA,))
    strip_control: bool = _f(True, "Remove control characters and ANSI escape sequences.",
                             steps=CORPUS_STEPS, pins=(DATA,))
    strip_punctuation: bool = _f(False, "Remove punctuation characters (as one of the old tutorials did).",
                                 steps=CORPUS_STEPS, pins=(DATA,))
    dedupe_lines: bool = _f(False, "Drop exact duplicate lines (memory: 8 bytes per distinct line).",
                            steps=CORPUS_STEPS, pins=(DATA,))
    max_line_length: int = _f(20000, "Lines longer than this many characters are dropped and counted.",
                              steps=CORPUS_STEPS, pins=(DATA,))
    max_documents: int = _f(0, "Read only this many documents (0: all): a first try.", steps=CORPUS_STEPS, pins=(DATA,))
    max_bytes: int = _f(0, "Stop at a document end past this many bytes of text (0: all).", steps=CORPUS_STEPS,
                        pins=(DATA,))


@dataclass
class VocabConfig(Section):
    """How a WordPiece vocab is built from the corpus."""

    vocab_size: int = _f(32000, "Exact size of the vocab.txt to build.", steps=(VOCAB,))
    num_unused_tokens: int = _f(100, "[unusedN] placeholders reserved for later domain tokens.", steps=(VOCAB,))
    vocab_sample_lines: int = _f(1_000_000, "Lines sampled at random from the corpus to train SentencePiece.",
                                 steps=(VOCAB,))
    sentencepiece_model_type: str = _f("bpe", "SentencePiece algorithm: bpe or unigram.", choices=("bpe", "unigram"),
                                       steps=(VOCAB,))


@dataclass
class PretrainingDataConfig(Section):
    """How pretraining instances are made (flags of Google's create_pretraining_data.py)."""

    recipe: str = _f("modern", "modern (the default from scratch): packed MLM-only sequences, 30% masking, no "
                     "dropout, AdamW beta2 0.98, warmup-stable-decay. classic (the default with a BERT "
                     "init_checkpoint, whose own recipe it continues): Google's BERT, NSP, 15% masking, dropout "
                     "0.1, linear decay. Settings given explicitly win.",
                     choices=("classic", "modern"), steps=(CREATE_DATA, TRAIN))
    vocab_file: str = _f("", "WordPiece vocab.txt, or (ModernBERT) a Hugging Face tokenizer.json or a model folder "
                         "with one; [PAD] [UNK] [CLS] [SEP] [MASK] required.", steps=(CREATE_DATA, TRAIN))
    max_seq_length: int = _f(128, "Tokens per sequence, [CLS] and [SEP]s included.",
                             steps=(CREATE_DATA,), pins=(DATA, RUN))
    max_predictions_per_seq: int = _f(0, "Most masked positions per sequence; 0: as many as masking fills at "
                                      "max_seq_length and masked_lm_prob (20 for 128 at 0.15, as BERT; 10 for 64).",
                                      steps=(CREATE_DATA,), pins=(DATA, RUN))
    masked_lm_prob: float = _f(0.15, "Fraction of real tokens masked (training shards).", steps=(CREATE_DATA, TRAIN),
                               pins=(DATA,))
    eval_masked_lm_prob: float = _f(0.15, "Fraction masked in the eval shards: BERT's 0.15 whatever masked_lm_prob "
                                    "is, so held-out figures of runs with different masking rates compare.",
                                    steps=(CREATE_DATA,), pins=(DATA,))
    pack_sequences: bool = _f(False, "Fill every sequence with consecutive sentences, across documents with a "
                              "[SEP] between them (RoBERTa's full sentences; MLM only, implies no_nsp).",
                              steps=(CREATE_DATA,), pins=(DATA,))
    dupe_factor: int = _f(10, "Times each document is used, with different masks.", steps=(CREATE_DATA,), pins=(DATA,))
    short_seq_prob: float = _f(0.1, "Probability of a shorter target length (as in BERT).",
                               steps=(CREATE_DATA,), pins=(DATA,))
    random_seed: int = _f(12345, "Seed for everything random in data creation.",
                          steps=(VOCAB, CREATE_DATA), pins=(DATA,))
    do_lower_case: bool = _f(True, "Lower-case and strip accents (uncased models).", steps=CORPUS_STEPS, pins=(DATA,))
    do_whole_word_mask: bool = _f(False, "Mask all WordPieces of a word together.", steps=(CREATE_DATA,), pins=(DATA,))
    no_nsp: bool = _f(False, "MLM only (RoBERTa-style): segments are consecutive sentences, no random next.",
                      steps=(CREATE_DATA, TRAIN), pins=(DATA, RUN))
    chinese_whole_word: bool = _f(False, "Whole-word masking of Chinese words found by jieba.",
                                  steps=(CREATE_DATA,), pins=(DATA,))
    num_shards: int = _f(0, "Training shards to write; 0: one per 16 MB of text, and at least 8 so that worker "
                         "processes share the work (under 2 MB of text: one per 256 KB).",
                         steps=(CREATE_DATA,), pins=(DATA,))
    eval_fraction: float = _f(0.01, "Fraction of documents held out in separate eval shards.",
                              steps=(CREATE_DATA,), pins=(DATA,))
    workers: int = _f(0, "Worker processes; 0 uses all cores.", steps=(CREATE_DATA, DEMO))
    runner: str = _f("", "Run create-data on Apache Beam with this runner (DirectRunner, DataflowRunner, FlinkRunner, "
                     "SparkRunner); empty: local worker processes. The shards are the same bytes either way.",
                     steps=(CREATE_DATA,))
    beam_options: str = _f("", "Beam pipeline options for --runner, as on a command line (e.g. '--project=P "
                           "--region=R --temp_location=gs://B/tmp --service_account_email=SA').", steps=(CREATE_DATA,))


@dataclass
class ModelConfig(Section):
    """Which BERT to build."""

    model_family: str = _f(BERT.name, "bert: Google's BERT. modernbert: ModernBERT (RoPE, GeGLU, local-global "
                           "attention; MLM only, JAX backend); trained with --recipe modern unless a recipe is given.",
                           choices=tuple(FAMILIES), steps=(TRAIN,), pins=(RUN,))
    model_size: str = _f("", "Named size such as L4-H256 or base (modernbert: base, large, L4-H256...); ignored when "
                         "bert_config_file is set.", steps=(TRAIN,))
    bert_config_file: str = _f("", "bert_config.json of the model to build; modernbert: a transformers config.json "
                               "(model_type modernbert).", steps=(TRAIN,))
    max_position_embeddings: int = _f(0, "Positions of a model built from model_size (the longest max_seq_length it "
                                      "trains on); 0: the family's own, bert 512 and modernbert 8,192 as released "
                                      "(a run continued: the run's).", steps=(TRAIN,))
    init_checkpoint: str = _f("", "Initial weights: a Google TF checkpoint or a Hugging Face BERT folder "
                              "(modernbert: a transformers ModernBERT folder).", steps=(TRAIN,))
    hidden_dropout_prob: float = _f(-1.0, "Dropout rate; -1 keeps bert_config's (0.1 for a model_size; modernbert: "
                                    "its config's embedding, attention and MLP dropout).", steps=(TRAIN,))
    hidden_act: str = _f("gelu", "Feed-forward activation of a BERT built from model_size: gelu (exact, erf: "
                         "Hugging Face's BERT) or gelu_new (its tanh approximation: Google's BERT repository's; on "
                         "a GPU computed in the matmul's epilogue). A bert_config_file or checkpoint keeps its own; "
                         "modernbert: its config's hidden_activation.", choices=BERT_ACTIVATIONS, steps=(TRAIN,))


@dataclass
class TrainConfig(Section):
    """How the model is trained (flags of Google's run_pretraining.py)."""

    train_batch_size: int = _f(32, "Global batch size, over all replicas.", steps=(TRAIN,), pins=(RUN,))
    learning_rate: float = _f(1e-4, "Peak learning rate.", steps=(TRAIN,))
    num_train_steps: int = _f(100_000, "Total optimizer steps.", steps=(TRAIN,))
    num_warmup_steps: int = _f(-1, "Linear warmup steps; -1: 10% of num_train_steps, at most 10,000 (logged).",
                               steps=(TRAIN,))
    lr_schedule: str = _f("linear", "linear: warmup, then decay over the whole run (BERT). wsd: warmup, constant, "
                          "then a cool-down over the last num_cooldown_steps; raise or lower num_train_steps on "
                          "resume to move the cool-down (it never jumps).", choices=("linear", "wsd"), steps=(TRAIN,))
    num_cooldown_steps: int = _f(0, "wsd: steps of the final decay; 0: 20% of num_train_steps.", steps=(TRAIN,))
    rewarm_steps: int = _f(0, "Extending a run whose learning rate decayed to ~0: warm up again over this many "
                           "steps, then decay to the new end (0: refuse, saying so).", steps=(TRAIN,))
    save_checkpoints_steps: int = _f(1000, "Steps between checkpoints (0: by time alone).", steps=(TRAIN,))
    save_checkpoints_minutes: float = _f(0.0, "Minutes between checkpoints (0: by steps alone); with both, whichever "
                                         "comes first. The end and a stop (deadline, SIGTERM) always save.",
                                         steps=(TRAIN,))
    optimizer: str = _f("adamw", "adamw (BERT's Adam with decoupled weight decay) or lamb (large batches).",
                        choices=("adamw", "lamb"), steps=(TRAIN,), pins=(RUN,))
    weight_decay_rate: float = _f(0.01, "Decoupled weight decay; LayerNorm and bias weights are excluded.",
                                  steps=(TRAIN,))
    adam_beta1: float = _f(0.9, "Adam/LAMB first-moment decay.", steps=(TRAIN,))
    adam_beta2: float = _f(0.999, "Adam/LAMB second-moment decay.", steps=(TRAIN,))
    adam_epsilon: float = _f(1e-6, "Adam/LAMB epsilon.", steps=(TRAIN,))
    lr_decay_power: float = _f(1.0, "Polynomial decay power after warmup (1.0: linear, as in BERT).", steps=(TRAIN,))
    end_learning_rate: float = _f(0.0, "Learning rate reached at num_train_steps.", steps=(TRAIN,))
    clip_norm: float = _f(1.0, "Global gradient-norm clipping threshold (0 disables).", steps=(TRAIN,))
    gradient_accumulation_steps: int = _f(1, "Micro-batches per optimizer step (train_batch_size is split).",
                                          steps=(TRAIN,))
    steps_per_execution: int = _f(0, "Steps per compiled call (iterations_per_loop); 0: auto by accelerator.",
                                  steps=(TRAIN,))
    eval_batch_size: int = _f(0, "Global eval batch size (0: train_batch_size).", steps=(TRAIN, EVALUATE))
    max_eval_steps: int = _f(100, "Most eval batches per evaluation.", steps=(TRAIN, EVALUATE))
    eval_every_steps: int = _f(-1, "Steps between evaluations on the eval shards (0: only at the end; -1: about ten "
                               "over the run, every 50 to 1,000 steps, often enough to see the held-out loss turn).",
                               steps=(TRAIN,))
    log_every_steps: int = _f(100, "Steps between TensorBoard scalars and log lines.", steps=(TRAIN,))
    peak_tflops: float = _f(0.0, "Dense peak TFLOP/s of all the devices training together, at the training "
                            "precision, for the MFU in the log (0: the published peak of a known device).",
                            steps=(TRAIN,))
    dynamic_masking: bool = _f(False, "Re-mask on the fly each time a sequence is read (RoBERTa-style).",
                               steps=(TRAIN,), pins=(RUN,))
    document_masks: str = _f("auto", "Keep the documents of packed rows apart: attention within a document only, "
                             "positions from 0 in each (JAX backend). auto: on for modernbert and the modern recipe, "
                             "off for NSP data and for runs started before the setting.",
                             choices=("auto", "on", "off"), steps=(TRAIN,))
    shuffle_buffer_size: int = _f(10_000, "Records in the shuffle buffer of the training input.",
                                  steps=(TRAIN,), pins=(RUN,))
    train_seed: int = _f(0, "Seed for weight initialisation, data order, dropout and dynamic masks.",
                         steps=(TRAIN,), pins=(RUN,))
    backend: str = _f("auto", "Training backend: tensorflow (bert4keras, tf-keras), jax (Keras 3 on JAX: the "
                      "TPU path of images without TensorFlow) or auto (jax where TensorFlow cannot use the "
                      "accelerator or is not installed).", choices=("tensorflow", "jax", "auto"), steps=(TRAIN,),
                      pins=(RUN,))
    accelerator: str = _f("auto", "auto, tpu, gpu or cpu.", choices=("auto", "tpu", "gpu", "cpu"), steps=(TRAIN,))
    tpu_name: str = _f("local", "TPU to use: 'local' on TPU VMs (Colab, Kaggle), or a TPU name/grpc address.",
                       steps=(TRAIN,))
    worker_hosts: str = _f("", "Training machines as host:port,host:port (MultiWorkerMirroredStrategy; the same "
                           "list on each, task 0 first); empty: TF_CONFIG if set, else this machine alone.",
                           steps=(TRAIN,))
    task_index: int = _f(0, "This machine's place in --worker_hosts (0: the chief, which writes the run folder).",
                         steps=(TRAIN,))
    coordinator_address: str = _f("", "JAX backend on several machines (or processes): process 0's HOST:PORT, the "
                                  "same on each; empty: one process, or what JAX finds by itself (a TPU VM pod, "
                                  "JAX_COORDINATOR_ADDRESS).", steps=(TRAIN,), launch=True)
    num_processes: int = _f(0, "JAX backend: how many processes train together (one per machine); 0: one, or what "
                            "JAX finds by itself on a TPU VM pod; 1: this machine alone.", steps=(TRAIN,),
                            launch=True)
    process_index: int = _f(0, "JAX backend: this process's place among --num_processes (0: the chief, which "
                            "writes the run folder).", steps=(TRAIN,), launch=True)
    worker_wait_minutes: float = _f(10.0, "Several machines: how long each waits for the others to start before "
                                    "giving up, naming the missing ones.", steps=(TRAIN,))
    mixed_precision: str = _f("auto", "auto (bfloat16 TPU, float16 on capable GPUs, float32 CPU), float32, bfloat16 "
                              "or float16.", choices=("auto", "float32", "bfloat16", "float16"), steps=(TRAIN,))
    jit_compile: str = _f("auto", "XLA-compile the training step: auto (TPU/GPU), on or off.",
                          choices=("auto", "on", "off"), steps=(TRAIN,))
    session_hours: float = _f(0.0, "Session length: 0 = the platform's (Colab 12 h, Kaggle 9 h, else none), "
                              "-1 = none; training saves and stops cleanly before it ends.", steps=(TRAIN,))
    session_margin_minutes: float = _f(10.0, "Stop this long before the session ends (time for the last save).",
                                       steps=(TRAIN,))
    log_example_ids: bool = _f(False, "Append the ids of the examples each step used to logs/example_ids.jsonl.",
                               steps=(TRAIN,))


@dataclass
class StorageConfig(Section):
    """Where things live."""

    data_dir: str = _f("", "Folder (or gs:// URL) holding the TFRecord shards and manifest.json.",
                       steps=(TRAIN, EVALUATE, STORAGE_CHECK))
    output_dir: str = _f("", "Folder (or gs:// URL) this step writes to (vocab: OUTPUT_DIR/vocab.txt).",
                         steps=(VOCAB, CREATE_DATA, TRAIN, DEMO, STORAGE_CHECK))
    keep_checkpoint_max: int = _f(5, "Newest checkpoints kept in the run folder (one more while saving).",
                                  steps=(TRAIN,))
    mirror_dir: str = _f("", "Drive folder or gs:// URL where the run's checkpoints are mirrored in the background.",
                         steps=(TRAIN,))
    mirror_keep: int = _f(2, "Newest checkpoints kept in mirror_dir (one more while copying); older ones are "
                          "deleted for good (on Drive: not into its bin).", steps=(TRAIN,))
    mirror_max_lag: int = _f(2, "Checkpoints the mirror may be behind (the one being copied counts) before "
                             "mirror_failure applies.", steps=(TRAIN,))
    mirror_failure: str = _f("stop", "A mirror that falls behind: stop (training saves and exits 75, saying why) or "
                             "continue (warns at each save).", choices=("stop", "continue"), steps=(TRAIN,))
    transfer_workers: int = _f(8, "Parallel file transfers to and from Cloud Storage.", steps=(TRANSFER, TRAIN))
    transfer_retries: int = _f(5, "Retries per file on transient errors (exponential backoff).",
                               steps=(TRANSFER, TRAIN))
    resumable_chunk_mb: int = _f(8, "Files at least this large go up in resumable chunks of this many MiB.",
                                 steps=(TRANSFER, TRAIN))
    parallel_threshold_mb: int = _f(150, "Files at least this large move as parallel slices (composite upload, "
                                    "ranged download) when transfer_workers > 1.", steps=(TRANSFER, TRAIN))
    mount_drive: bool = _f(False, "On Colab, mount Google Drive when a path is under /content/drive.",
                           steps=(TRANSFER, TRAIN))

    def transfer_options(self, progress: bool = False):
        """These settings as the storage layer's options (uploads, downloads and the checkpoint mirror)."""
        from .storage import TransferOptions

        chunk = self.resumable_chunk_mb * 1024 * 1024
        return TransferOptions(workers=self.transfer_workers, retries=self.transfer_retries, chunk_size=chunk,
                               resumable_threshold=chunk, parallel_threshold=self.parallel_threshold_mb * 1024 * 1024,
                               progress=progress)


SECTIONS: dict[str, type] = {"corpus": CorpusConfig, "vocab": VocabConfig, "data": PretrainingDataConfig,
                             "model": ModelConfig, "train": TrainConfig, "storage": StorageConfig}


# What the modern recipe sets (the classic recipe: these settings' defaults). One setting turns on what
# the cheap-BERT recipes (RoBERTa, 24hBERT, cramming, MosaicBERT) share.
MODERN_RECIPE: dict[str, Any] = {
    "pack_sequences": True,  # no compute spent on padding
    "no_nsp": True,  # next-sentence prediction has no meaning across packed documents
    "masked_lm_prob": 0.3,  # more signal per sequence; eval shards stay at eval_masked_lm_prob (0.15)
    "max_predictions_per_seq": 0,  # enough slots for that rate
    "hidden_dropout_prob": 0.0,  # a single pass over the data does not overfit
    "adam_beta2": 0.98,  # steadier with larger learning rates
    "lr_schedule": "wsd",  # the cool-down can be started in whichever session the user stops
    "hidden_act": "gelu_new",  # Google's BERT's own; on a GPU the feed-forward GEMM computes it (GPU_NOTES)
}
