"""BERT for pretraining in Keras 3 layers: the TensorFlow backend's model, layer for layer.

Post-LayerNorm BERT (embeddings summed and normalised, then self-attention and feed-forward blocks each
followed by a residual LayerNorm), the MLM head computed only at the masked positions and tied to the
token embeddings, and an optional NSP head: the shape of :mod:`..tf_backend.model` and of Google's BERT, so
weights move between the backends by Google's checkpoint names (:func:`google_variables`). Every weight
matrix gets its own truncated-normal draw. keras-hub's BERT layers are not used: keras-hub requires
``tensorflow-text``, which brings TensorFlow back in.

Attention goes through ``jax.nn.dot_product_attention`` (:data:`ATTENTION_PATHS`): cuDNN's fused kernel on a GPU in
bfloat16 or float16, XLA's fused attention elsewhere (TPUs, CPUs, float32), the logits and softmax in float32 either
way. That function has no dropout on the attention probabilities, so a training call with
``attention_probs_dropout_prob > 0`` (BERT's original recipe) takes the explicit matmul-softmax-dropout-matmul path;
with no attention dropout (the modern recipe) training and inference both take the fused path. On a TPU (or
compiled for one) ``auto`` takes JAX's splash attention kernel (:mod:`.splash`) at lengths that are multiples of 128.

Documents: a model given ``document_separator`` (the [SEP] id; :func:`.input.document_separator`) keeps the
documents of a packed row apart: a token attends only to its own document (the kernel's segment ids on the splash
path, a block-diagonal boolean mask elsewhere) and its position restarts at 0 in each document, so each document
gets the logits it gets alone. Without it (and with one document per row) the model is Google's BERT.
"""

from __future__ import annotations

import logging
import math
import warnings

from . import select_keras_backend

select_keras_backend()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
from keras import ops  # noqa: E402

from ..environment import environment_override  # noqa: E402
from ..errors import UserInputError  # noqa: E402
from ..models.bert_config import BertConfig  # noqa: E402
from ..models.weight_names import NSP_WEIGHTS  # noqa: E402
from . import splash  # noqa: E402
from .documents import document_ids, document_positions  # noqa: E402
from .lean_layers import LayerNorm, exact_gelu, shared_input_projections  # noqa: E402
from .lookups import OneHotEmbedding, one_hot_rows, token_embedding  # noqa: E402

MASK_BIAS = -1e9  # added to the attention scores of padding: exp() of it is exactly 0
# How the blocks compute attention. auto: cuDNN's fused kernel where it applies (a CUDA GPU, bfloat16 or float16
# inputs, head size a multiple of 8), else XLA's; xla: jax.nn.dot_product_attention's XLA implementation; cudnn:
# cuDNN's kernel or an error; explicit: matmul, softmax, dropout, matmul as Google's BERT writes it; splash: the TPU
# kernel (Pallas's interpreter off a TPU: tests). auto takes splash where it applies (:func:`.splash.applies`).
ATTENTION_PATHS = ("auto", "xla", "cudnn", "explicit", "splash")
log = logging.getLogger(__name__)


def keep_tensorflow_out() -> None:
    """Tell Keras that TensorFlow is absent, so that it never imports it into this JAX process.

    Keras 3 imports TensorFlow wherever it is installed merely to ask whether it is there (``set_random_seed``
    does, to seed it too; so do some data and serialisation helpers): seconds of start-up, TensorFlow's threads
    and memory, and on Kaggle's image a TensorFlow that cannot use the TPU. The answer is fixed before anything
    asks; a process that already holds TensorFlow is left as it is.
    """
    import sys

    try:
        from keras.src.utils import module_utils
    except ImportError:  # another layout of Keras's internals: nothing to tell
        return
    lazy = getattr(module_utils, "tensorflow", None)
    if "tensorflow" not in sys.modules and getattr(lazy, "module", True) is None:
        lazy._available = False


keep_tensorflow_out()


def activation(name: str):
    """BERT's activation names: ``gelu`` is the exact (erf) GELU (:func:`exact_gelu`), as in Google's BERT and
    bert4keras."""
    if name == "gelu":
        return exact_gelu
    if name in ("gelu_new", "gelu_fast", "gelu_pytorch_tanh"):
        return lambda x: keras.activations.gelu(x, approximate=True)
    return keras.activations.get(name)


class _Factory:
    """Layers with BERT's initialisers and the run's dtype policy; a new initializer for every weight."""

    def __init__(self, config: BertConfig, dtype):
        self.stddev, self.dtype = config.initializer_range, dtype

    def init(self):
        return keras.initializers.TruncatedNormal(stddev=self.stddev)

    def dense(self, units: int, name: str, activation=None):
        return keras.layers.Dense(units, activation=activation, kernel_initializer=self.init(), name=name,
                                  dtype=self.dtype)

    def norm(self, name: str):
        return LayerNorm(epsilon=1e-12, name=name, dtype=self.dtype)

    def embedding(self, rows: int, width: int, name: str, one_hot: bool = False):
        kind = OneHotEmbedding if one_hot else token_embedding
        return kind(rows, width, embeddings_initializer=self.init(), name=name, dtype=self.dtype)

    def dropout(self, rate: float):
        return keras.layers.Dropout(rate, dtype=self.dtype)


def attention_path(setting: str | None = None) -> str:
    """The attention path asked for: ``setting``, else ``TPU_PRETRAIN_ATTENTION``, else ``auto``."""
    path = (setting or environment_override("TPU_PRETRAIN_ATTENTION", "auto")).strip().lower()
    if path not in ATTENTION_PATHS:
        raise UserInputError(f"attention path {path!r} is not one of {', '.join(ATTENTION_PATHS)} "
                             "(TPU_PRETRAIN_ATTENTION).")
    return path


def cudnn_applies(dtype, head_size: int) -> bool:
    """Whether cuDNN's fused attention can take these inputs on this process's default JAX backend."""
    return (jax.default_backend() == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)
            and head_size % 8 == 0 and head_size <= 128)


_CUDNN_REFUSED: set[str] = set()
_SAID: set[str] = set()


def say_path(what: str) -> None:
    """Log once per process which attention path a model's layers take (traced once per compile)."""
    if what not in _SAID:
        _SAID.add(what)
        log.info("Attention: %s.", what)


def attention_mask(attend, documents=None, window: int | None = None):
    """``[batch, 1, queries or 1, keys]`` (bool): keys that are not padding, of the query's document (``documents``
    from :func:`.documents.document_ids`, None: any) and at most ``window`` positions away (None: any)."""
    mask = attend[:, None, None, :]
    if documents is not None:
        mask = mask & (documents[:, :, None] == documents[:, None, :])[:, None]
    if window is not None:
        positions = jnp.arange(attend.shape[1])
        mask = mask & (jnp.abs(positions[:, None] - positions[None, :]) <= window)[None, None]
    return mask


def masked_attention(q, k, v, attend, documents=None, window=None, path: str = "auto", mesh=None):
    """Attention under padding, documents and a window: the splash kernel where ``path`` takes it (segment ids:
    ``documents``, else padding against the rest), else :func:`fused_attention` under the same mask."""
    if path == "splash" or (path == "auto" and splash.applies(q.shape[1], mesh)):
        say_path(f"splash kernel ({'sliding window, ' if window else ''}"
                 f"{'documents apart' if documents is not None else 'documents together'})")
        segments = document_ids(None, attend, None) if documents is None else documents
        return splash.attention(q, k, v, segments, window, mesh)
    return fused_attention(q, k, v, attend, path, documents, window)


def fused_attention(q, k, v, attend, path: str = "auto", documents=None, window=None):
    """Scaled dot-product attention of ``[batch, length, heads, head_size]`` arrays under :func:`attention_mask`
    (padding where ``attend`` is False, other ``documents``, beyond ``window``): ``jax.nn.dot_product_attention``.

    cuDNN's kernel where it applies (a CUDA GPU, 16-bit inputs): padding alone as key lengths (the count of True in
    ``attend``, at least 1: the same mask, since BERT's padding is trailing), documents or a window as the mask,
    which the kernel adds as a bias without a ``[batch, heads, length, length]`` tensor in memory. Else XLA's
    implementation with the boolean mask. Both compute the logits with float32 accumulation and the softmax in
    float32, and return the inputs' dtype.
    """
    padding_only = documents is None and window is None
    if path == "cudnn" or (path == "auto" and cudnn_applies(q.dtype, q.shape[-1])):
        try:
            if padding_only:
                lengths = jnp.maximum(jnp.sum(attend, axis=1, dtype=jnp.int32), 1)
                return jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths, implementation="cudnn")
            say_path("cuDNN's fused kernel under the document/window mask")
            return jax.nn.dot_product_attention(q, k, v, mask=attention_mask(attend, documents, window),
                                                implementation="cudnn")
        except (NotImplementedError, ValueError, RuntimeError) as error:
            if path == "cudnn":
                raise
            if str(error) not in _CUDNN_REFUSED:
                _CUDNN_REFUSED.add(str(error))
                warnings.warn(f"cuDNN fused attention refused these inputs ({error}); using XLA's attention.",
                              stacklevel=2)
    mask = attend[:, None, None, :] if padding_only else attention_mask(attend, documents, window)
    if q.dtype == jnp.float16 and jax.default_backend() != "gpu":
        # the function asks XLA for float16 dots with float32 results (F16_F16_F32), which CPUs and TPUs refuse at
        # compile time: float16 there (the tests' stand-in for a T4) computes attention in float32
        return jax.nn.dot_product_attention(*(t.astype(jnp.float32) for t in (q, k, v)), mask=mask,
                                            implementation="xla").astype(q.dtype)
    return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")


def explicit_attention(q, k, v, mask, dropout=None, training=False):
    """The same attention written out (Google BERT's order): scores in the inputs' dtype, softmax in float32 with
    :data:`MASK_BIAS` added where ``mask`` (:func:`attention_mask`) is False, ``dropout`` (a Keras layer) on the
    probabilities, then the weighted sum. A ``[batch, length]`` mask is padding alone."""
    mask = mask[:, None, None, :] if mask.ndim == 2 else mask
    q, k, v = (jnp.transpose(t, (0, 2, 1, 3)) for t in (q, k, v))
    scores = jnp.matmul(q, jnp.transpose(k, (0, 1, 3, 2))) / math.sqrt(q.shape[-1])
    bias = jnp.where(mask, 0.0, MASK_BIAS).astype(jnp.float32)
    probs = jax.nn.softmax(scores.astype(jnp.float32) + bias, axis=-1).astype(q.dtype)
    if dropout is not None:
        probs = dropout(probs, training=training)
    return jnp.transpose(jnp.matmul(probs, v), (0, 2, 1, 3))


class TransformerBlock(keras.layers.Layer):
    """Self-attention and feed-forward, each followed by dropout, the residual and LayerNorm (post-LN).

    ``attention`` is one of :data:`ATTENTION_PATHS`; a training call with attention dropout takes the explicit path
    whatever it says (the fused function has no dropout on the probabilities).
    """

    def __init__(self, config: BertConfig, make: _Factory, attention: str = "auto", **kwargs):
        super().__init__(dtype=make.dtype, **kwargs)
        h = config.hidden_size
        self.heads, self.attention = config.num_attention_heads, attention
        self.query, self.key, self.value = (make.dense(h, n) for n in ("query", "key", "value"))
        self.attention_output = make.dense(h, "attention_output")
        self.attention_norm = make.norm("attention_norm")
        self.intermediate = make.dense(config.intermediate_size, "intermediate", activation(config.hidden_act))
        self.output_dense = make.dense(h, "output")
        self.output_norm = make.norm("output_norm")
        self.attention_dropout = make.dropout(config.attention_probs_dropout_prob)
        self.hidden_dropout = make.dropout(config.hidden_dropout_prob)
        self.ffn_dropout = make.dropout(config.hidden_dropout_prob)

    def build(self, input_shape):
        """The query, key and value projections' weights (read in :meth:`context`, not called as layers)."""
        for layer in (self.query, self.key, self.value):
            layer.build(input_shape)

    def _heads(self, x):
        """``[batch, length, hidden]`` -> ``[batch, length, heads, head_size]`` (a reshape, no transpose)."""
        batch, length, width = x.shape
        return ops.reshape(x, (batch, length, self.heads, width // self.heads))

    def explicit(self, training: bool) -> bool:
        """Whether this call takes the explicit path: asked for, or attention dropout in training."""
        return self.attention == "explicit" or bool(training and self.attention_dropout.rate > 0)

    def context(self, x, attend, documents=None, training=False, mesh=None):
        """``(the attention context [batch, length, hidden] before the output projection, x)``: ``x`` as returned by
        :func:`~.lean_layers.shared_input_projections`, for the residual (its gradient then joins the projections')."""
        projections = (self.query, self.key, self.value)
        q, k, v, x = shared_input_projections(x, tuple(ops.cast(p.kernel, x.dtype) for p in projections),
                                              tuple(ops.cast(p.bias, x.dtype) for p in projections))
        q, k, v = self._heads(q), self._heads(k), self._heads(v)
        if self.explicit(training):
            say_path("explicit (attention dropout in training)" if self.attention != "explicit" else "explicit")
            context = explicit_attention(q, k, v, attention_mask(attend, documents), self.attention_dropout, training)
        else:
            context = masked_attention(q, k, v, attend, documents, None, self.attention, mesh)
        return ops.reshape(context, x.shape), x

    def call(self, x, attend, documents=None, training=False, mesh=None):
        context, x = self.context(x, attend, documents, training, mesh)
        x = self.attention_norm(x + self.hidden_dropout(self.attention_output(context), training=training))
        ffn = self.output_dense(self.intermediate(x))
        return self.output_norm(x + self.ffn_dropout(ffn, training=training))


class Bias(keras.layers.Layer):
    """A learnt bias added to the last axis (the MLM output bias)."""

    def build(self, input_shape):
        self.bias = self.add_weight(shape=(input_shape[-1],), initializer="zeros", name="bias")

    def call(self, x):
        return x + ops.cast(self.bias, x.dtype)


class PretrainingBert(keras.Model):
    """``[input_ids, segment_ids, masked_lm_positions]`` -> ``[mlm_logits(, nsp_logits)]`` (logits, float32).

    Padding is read from ``input_ids == 0`` ([PAD] is id 0 in every BERT vocab), as in the TensorFlow model.
    ``attention``: one of :data:`ATTENTION_PATHS` (default: ``TPU_PRETRAIN_ATTENTION``, else ``auto``).
    ``document_separator``: the [SEP] id when documents are kept apart (set by the trainer); ``data_mesh``: the
    devices the examples are split over (the splash kernel runs per chip).
    """

    document_separator: int | None = None
    data_mesh = None

    def __init__(self, config: BertConfig, with_nsp: bool = True, dtype=None, attention: str | None = None,
                 **kwargs):
        super().__init__(name="bert", dtype=dtype, **kwargs)
        make = _Factory(config, dtype)
        self.config, self.with_nsp, self.attention = config, with_nsp, attention_path(attention)
        h = config.hidden_size
        self.token_embedding = make.embedding(config.vocab_size, h, "word_embeddings")
        self.segment_embedding = make.embedding(config.type_vocab_size, h, "token_type_embeddings", one_hot=True)
        self.position_embedding = make.embedding(config.max_position_embeddings, h, "position_embeddings",
                                                 one_hot=True)
        self.embedding_norm = make.norm("embedding_norm")
        self.embedding_dropout = make.dropout(config.hidden_dropout_prob)
        self.blocks = [TransformerBlock(config, make, self.attention, name=f"layer_{i}")
                       for i in range(config.num_hidden_layers)]
        self.mlm_dense = make.dense(h, "mlm_dense", activation(config.hidden_act))
        self.mlm_norm = make.norm("mlm_norm")
        self.mlm_bias = Bias(name="mlm_bias", dtype=dtype)
        if with_nsp:
            self.pooler = make.dense(h, "pooler", "tanh")
            self.nsp = make.dense(2, "nsp")

    def encode(self, input_ids, segment_ids, training=False):
        """The last hidden states ``[batch, length, hidden]``."""
        length = input_ids.shape[1]
        attend = input_ids != 0
        documents = None if self.document_separator is None else document_ids(input_ids, attend,
                                                                               self.document_separator)
        x = self.token_embedding(input_ids) + self.segment_embedding(segment_ids)
        if documents is None:
            x = x + self.position_embedding(ops.arange(length))[None]
        else:
            x = x + self.position_embedding(document_positions(documents))
        x = self.embedding_dropout(self.embedding_norm(x), training=training)
        for block in self.blocks:
            x = block(x, attend, documents, training=training, mesh=self.data_mesh)
        return x

    def call(self, inputs, training=False):
        input_ids, segment_ids, positions = inputs
        sequence = self.encode(input_ids, segment_ids, training)
        x = self.mlm_norm(self.mlm_dense(one_hot_rows(sequence, ops.cast(positions, "int32"))))
        embeddings = ops.cast(self.token_embedding.embeddings, self.compute_dtype)
        mlm_logits = ops.cast(self.mlm_bias(ops.matmul(x, ops.transpose(embeddings))), "float32")
        if not self.with_nsp:
            return [mlm_logits]
        nsp_logits = self.nsp(self.pooler(sequence[:, 0]))
        return [mlm_logits, ops.cast(nsp_logits, "float32")]


def build_model(config: BertConfig, max_seq_length: int, max_predictions_per_seq: int, with_nsp: bool = True,
                dtype=None, attention: str | None = None) -> PretrainingBert:
    """The model with its weights created, by one symbolic call (shapes only: Keras traces it, computing nothing),
    which makes the same weights as a call on a zero batch in a fraction of the time (0.35 s against 8.5 s for
    L2-H128 on a CPU, where the eager call ran each layer's operations one by one)."""
    config.check_sequence_length(max_seq_length)
    model = PretrainingBert(config, with_nsp, dtype=dtype, attention=attention)
    tokens = keras.KerasTensor((1, max_seq_length), "int32")
    model([tokens, tokens, keras.KerasTensor((1, max_predictions_per_seq), "int32")])
    return model


def google_variables(model: PretrainingBert) -> dict[str, keras.Variable]:
    """Every weight of the model under its Google BERT checkpoint name (the hub both backends share)."""
    out = {"bert/embeddings/word_embeddings": model.token_embedding.embeddings,
           "bert/embeddings/token_type_embeddings": model.segment_embedding.embeddings,
           "bert/embeddings/position_embeddings": model.position_embedding.embeddings,
           "bert/embeddings/LayerNorm/gamma": model.embedding_norm.gamma,
           "bert/embeddings/LayerNorm/beta": model.embedding_norm.beta}
    for i, block in enumerate(model.blocks):
        prefix = f"bert/encoder/layer_{i}/"
        dense = {"attention/self/query": block.query, "attention/self/key": block.key,
                 "attention/self/value": block.value, "attention/output/dense": block.attention_output,
                 "intermediate/dense": block.intermediate, "output/dense": block.output_dense}
        for name, layer in dense.items():
            out[f"{prefix}{name}/kernel"], out[f"{prefix}{name}/bias"] = layer.kernel, layer.bias
        norms = (("attention/output/LayerNorm", block.attention_norm), ("output/LayerNorm", block.output_norm))
        for name, layer in norms:
            out[f"{prefix}{name}/gamma"], out[f"{prefix}{name}/beta"] = layer.gamma, layer.beta
    out.update({"cls/predictions/transform/dense/kernel": model.mlm_dense.kernel,
                "cls/predictions/transform/dense/bias": model.mlm_dense.bias,
                "cls/predictions/transform/LayerNorm/gamma": model.mlm_norm.gamma,
                "cls/predictions/transform/LayerNorm/beta": model.mlm_norm.beta,
                "cls/predictions/output_bias": model.mlm_bias.bias})
    if model.with_nsp:
        out.update({"bert/pooler/dense/kernel": model.pooler.kernel, "bert/pooler/dense/bias": model.pooler.bias,
                    NSP_WEIGHTS: model.nsp.kernel, "cls/seq_relationship/output_bias": model.nsp.bias})
    return out


def to_google(name: str, value):
    """A model array as Google stores it (the NSP kernel transposed to [2, hidden])."""
    return value.T if name == NSP_WEIGHTS else value


def from_google(name: str, value):
    return value.T if name == NSP_WEIGHTS else value
