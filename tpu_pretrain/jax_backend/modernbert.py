"""ModernBERT for masked-LM pretraining in Keras 3 layers: transformers' ``ModernBertForMaskedLM``, layer for layer.

Token embeddings (no positions: rotary embeddings in every attention), LayerNorm and dropout; pre-LayerNorm layers
(layer 0 has no attention norm: its input is the normalised embeddings) of fused ``Wqkv`` attention with RoPE and a
GeGLU MLP (``Wi`` to twice the intermediate width, ``act(first half) * second half``, then ``Wo``); a final norm; the
MLM head (dense, activation, norm) and the decoder, tied to the token embeddings unless the config unties them.
Every ``global_attn_every_n_layers``-th layer from layer 0 attends globally with RoPE base ``global_rope_theta``; the
others attend to keys at most ``local_attention // 2`` positions away on either side (transformers' rule: ``|q - k|
<= local_attention // 2``) with base ``local_rope_theta``. Padding is read from ``input_ids == pad_token_id``, and,
where [PAD] is not id 0 (a tokenizer.json's vocab), from the zero ids after a row's last other id, as the data pads.

Attention goes through :func:`.attention.masked_attention`: on a TPU the splash kernel (``LocalMask`` for the local
layers); on a GPU of compute capability 8.0+ cuDNN's fused kernel, the mask of padding, documents and window as its
bias (global and local layers alike); on another GPU the explicit path; XLA's ``jax.nn.dot_product_attention``
elsewhere; a training call with attention dropout, or the ``explicit`` path, writes it out. With
``document_separator`` set, documents are kept apart (:mod:`.model`) and each document's rotary positions start at 0,
as in ModernBERT's own unpadded training. Weights move by transformers' state-dict names (:func:`hf_variables`).

Initialisation follows transformers' ``_init_weights``: truncated normals cut at 2 standard deviations (its
default ``initializer_cutoff_factor``; Keras's ``TruncatedNormal`` always cuts there), standard deviation
``initializer_range`` for the token embeddings, ``Wqkv`` and ``Wi``, and ``initializer_range / sqrt(2 * layers)``
for the attention and MLP output projections, the head's dense and an untied decoder; biases zero, norms one.
"""

from __future__ import annotations

import math

import numpy as np

from . import select_keras_backend

select_keras_backend()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
from keras import ops  # noqa: E402

from ..errors import UserInputError  # noqa: E402
from ..models.modernbert_config import ModernBertConfig  # noqa: E402
from . import splash  # noqa: E402
from .attention import (  # noqa: E402
    attention_mask,
    attention_path,
    explicit_attention,
    masked_attention,
    say_path,
    takes_splash,
)
from .devices import target_platform  # noqa: E402
from .documents import document_ids, document_positions  # noqa: E402
from .lean_layers import (  # noqa: E402
    Dense,
    LayerNorm,
    add_bias,
    dense_weights,
    heads_major_parts,
    heads_output,
    shared_input_projections,
)
from .lookups import TokenEmbedding, pads_logits, tied_logits  # noqa: E402
from .model import TiedLogits, activation, one_hot_rows  # noqa: E402

EMBEDDINGS = "model.embeddings.tok_embeddings.weight"
DECODER = "decoder.weight"  # tied: the embeddings themselves, never a variable of its own


class _Make:
    """Layers with ModernBERT's initialisers, bias and norm settings and the run's dtype policy."""

    def __init__(self, config: ModernBertConfig, dtype):
        self.config, self.dtype = config, dtype
        self.std_in = config.initializer_range
        self.std_out = config.initializer_range / math.sqrt(2.0 * config.num_hidden_layers)

    def dense(self, units: int, name: str, bias: bool, std: float):
        init = keras.initializers.TruncatedNormal(stddev=std)
        return Dense(units, use_bias=bias, kernel_initializer=init, name=name, dtype=self.dtype)

    def norm(self, name: str):
        return LayerNorm(epsilon=self.config.norm_eps, center=self.config.norm_bias, name=name, dtype=self.dtype)

    def dropout(self, rate: float):
        return keras.layers.Dropout(rate, dtype=self.dtype)


def rotary_tables(length: int, head_size: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """RoPE's cos and sin ``[length, head_size]`` for positions 0..length-1, in float32 as transformers computes
    them (frequencies ``theta ** (-2i / head_size)``, repeated for the two halves)."""
    inverse = (1.0 / (np.float32(theta) ** (np.arange(0, head_size, 2, dtype=np.float32) / np.float32(head_size))))
    angles = np.arange(length, dtype=np.float32)[:, None] * inverse.astype(np.float32)[None]
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rotary(x, cos, sin, heads_major: bool = False):
    """Rotate ``[batch, length, heads, head_size]`` (``heads_major``: ``[batch, heads, length, head_size]``) by
    position (halves; ``cos``, ``sin``: ``[length, head_size]`` or ``[batch, length, head_size]``) in ``x``'s dtype,
    as transformers does: bfloat16 rounds once more (0.27% rms from the exact rotation, 0.17% in float32) and XLA
    writes no float32 intermediates (ModernBERT-base, 1,024, v5e-8: 615.3 -> 592.8 M cycles by the cost model)."""
    half = x.shape[-1] // 2
    signed = jnp.concatenate([-sin[..., :half], sin[..., half:]], axis=-1)  # rotate-half's signs, on the table
    if cos.ndim == 2:
        cos, signed = cos[None], signed[None]
    cos, signed = (t[:, None] if heads_major else t[:, :, None] for t in (cos, signed))
    return x * cos.astype(x.dtype) + jnp.roll(x, half, axis=-1) * signed.astype(x.dtype)


def before_zero_tail(input_ids):
    """``[batch, length]`` (bool): positions up to a row's last nonzero id. The shards (and fill-mask, probe) pad
    rows with id 0 whatever the vocab's [PAD]; with [PAD] elsewhere, id 0 inside a row is a real token."""
    positions = jnp.arange(input_ids.shape[1])
    last = jnp.max(jnp.where(input_ids != 0, positions[None, :], -1), axis=1)
    return positions[None, :] <= last[:, None]


def explicit_masked_attention(q, k, v, mask, dropout=None, training=False):
    """Attention written out: scores, softmax in float32 over the keys ``mask`` allows, ``dropout`` (a Keras
    layer) on the probabilities, the weighted sum; ``[batch, length, heads, head_size]`` in and out."""
    q, k, v = (jnp.transpose(t, (0, 2, 1, 3)) for t in (q, k, v))
    scores = jnp.matmul(q, jnp.transpose(k, (0, 1, 3, 2))).astype(jnp.float32) / math.sqrt(q.shape[-1])
    probs = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1).astype(q.dtype)
    if dropout is not None:
        probs = dropout(probs, training=training)
    return jnp.transpose(jnp.matmul(probs, v), (0, 2, 1, 3))


def column_blocks(dense: keras.layers.Dense, x, parts: int) -> tuple:
    """``dense(x)`` split into ``parts`` equal blocks of its last axis (``Wqkv``'s query, key and value), each the
    product of ``x`` with that block of the kernel's columns.

    The weight stays one (transformers' layout); what changes is the backward pass. One product of the whole, then
    slices, made the forward copy the slices out for cuDNN's attention and the backward add the gradients it returns
    in kernels of their own; here each part's input gradient accumulates onto the last in the GEMMs
    (:func:`~.lean_layers.shared_input_projections`). ModernBERT-base at 1,024 compiled for an H100: 68.9 -> 67.6 ms
    per step, estimated. (``Wi``'s input and gate gain nothing so: the GeGLU's backward writes their gradients
    concatenated in the kernel that computes them.) A GPU's path only: the TPU compiler counts 6% more bytes per
    step for it (v5e, libtpu 0.0.42.1, batch 8: 123.8 GB against 116.7 for the one product and its slices)."""
    return shared_input_projections(x, *column_weights(dense, x.dtype, parts), True)[:parts]


def column_weights(dense: keras.layers.Dense, dtype, parts: int) -> tuple:
    """``(kernels, biases)``: ``dense``'s kernel and bias (None without one) cast to ``dtype`` (one cast each) and
    split into ``parts`` equal blocks of their columns."""
    (kernel, bias), width = dense_weights(dense, dtype), dense.units // parts
    kernels = tuple(kernel[:, i * width:(i + 1) * width] for i in range(parts))
    biases = None if bias is None else tuple(bias[i * width:(i + 1) * width] for i in range(parts))
    return kernels, biases


def at_rows(table, rows):
    """A rotary table's rows at ``rows`` (``[batch, n]``): ``[batch, n, head_size]``, from a table of positions
    ``[length, head_size]`` or of each token's ``[batch, length, head_size]`` (documents apart)."""
    return jnp.take(table, rows, axis=0) if table.ndim == 2 else jnp.take_along_axis(table, rows[:, :, None], axis=1)


class ModernBertLayer(keras.layers.Layer):
    """One pre-LN layer: ``x + Wo(attention(attn_norm(x)))``, then ``x + mlp(mlp_norm(x))``."""

    def __init__(self, config: ModernBertConfig, make: _Make, index: int, attention: str = "auto", **kwargs):
        super().__init__(dtype=make.dtype, **kwargs)
        h, inner = config.hidden_size, config.intermediate_size
        self.heads, self.attention = config.num_attention_heads, attention
        self.is_global = config.layer_is_global(index)
        self.window = None if self.is_global else config.local_attention // 2
        self.attn_norm = make.norm("attn_norm") if index else None  # transformers: Identity in layer 0
        self.wqkv = make.dense(3 * h, "Wqkv", config.attention_bias, make.std_in)
        self.attn_out = make.dense(h, "attn_Wo", config.attention_bias, make.std_out)
        self.mlp_norm = make.norm("mlp_norm")
        self.wi = make.dense(2 * inner, "Wi", config.mlp_bias, make.std_in)
        self.mlp_out = make.dense(h, "mlp_Wo", config.mlp_bias, make.std_out)
        self.gelu = activation(config.hidden_activation)
        self.probs_dropout = make.dropout(config.attention_dropout)
        self.attn_dropout = make.dropout(config.attention_dropout)
        self.mlp_dropout = make.dropout(config.mlp_dropout)

    def build(self, input_shape):
        """``Wqkv``'s and ``Wo``'s weights (read, not called as layers: :func:`column_blocks` on a GPU, the einsums
        of the splash kernel's order on a TPU)."""
        self.wqkv.build(input_shape)
        self.attn_out.build(input_shape)

    def context(self, x, attend, documents, rope, training=False, mesh=None):
        """The attention context ``[batch, length, hidden]`` before ``Wo`` (where the splash kernel runs, its
        ``[batch, heads, length, head_size]``, which :meth:`after_attention` projects as it is)."""
        batch, length, width = x.shape
        heads = (batch, length, self.heads, width // self.heads)
        explicit = self.attention == "explicit" or bool(training and self.probs_dropout.rate > 0)
        if splash.HEADS_MAJOR and not explicit and takes_splash(self.attention, length, width // self.heads, mesh):
            q, k, v = heads_major_parts(x, self.wqkv, 3, self.heads)
            q, k = apply_rotary(q, *rope, heads_major=True), apply_rotary(k, *rope, heads_major=True)
            return masked_attention(q, k, v, attend, documents, self.window, self.attention, mesh, heads_major=True)
        if target_platform(mesh) == "gpu":
            q, k, v = (ops.reshape(t, heads) for t in column_blocks(self.wqkv, x, 3))
        else:
            qkv = ops.reshape(self.wqkv(x), (batch, length, 3, *heads[2:]))
            q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        if explicit:
            say_path("explicit (attention dropout in training)" if self.attention != "explicit" else "explicit")
            context = explicit_masked_attention(q, k, v, attention_mask(attend, documents, self.window),
                                                self.probs_dropout, training)
        else:
            context = masked_attention(q, k, v, attend, documents, self.window, self.attention, mesh)
        return ops.reshape(context, x.shape)

    def call(self, x, attend, documents, cos, sin, training=False, mesh=None, rows=None):
        """The layer's output ``[batch, length, hidden]``; given ``rows``, at those rows only (:meth:`call_at_rows`)."""
        if rows is not None:
            return self.call_at_rows(x, rows, attend, documents, cos, sin, training, mesh)
        context = self.context(self.normed(x, mesh), attend, documents, (cos, sin), training, mesh)
        return self.after_attention(x, context, training, mesh)

    def normed(self, x, mesh=None):
        """The attention's input: ``x`` normalised (layer 0: ``x``, already the normalised embeddings)."""
        return self.attn_norm(x, mesh=mesh) if self.attn_norm is not None else x

    def after_attention(self, x, context, training=False, mesh=None):
        """``Wo`` and the residual, then the MLP sublayer: for each row of ``x``."""
        # the splash kernel's [batch, heads, length, head_size], else [batch, length, hidden]
        projected = heads_output(context, self.attn_out) if context.ndim == 4 else self.attn_out(context)
        x = x + self.attn_dropout(projected, training=training)
        gate_input, gate = ops.split(self.wi(self.mlp_norm(x, mesh=mesh)), 2, axis=-1)
        return x + self.mlp_out(self.mlp_dropout(self.gelu(gate_input) * gate, training=training))

    def call_at_rows(self, x, rows, attend, documents, cos, sin, training=False, mesh=None):
        """The layer's output at ``rows`` (``[batch, n]`` positions) only: the keys and values of every position, the
        queries, ``Wo`` and the MLP of those rows alone. The last layer's other rows reach no loss (the MLM head
        reads the masked positions): ModernBERT-base at 1,024 with 30% masked does 2.4% less arithmetic per step.
        Attention is the explicit path with float32 scores (as BERT's :meth:`.model.TransformerBlock.call_at_rows`:
        the fused kernels want the queries as long as the keys)."""
        batch, _, width = x.shape
        heads = (batch, -1, self.heads, width // self.heads)
        kernels, biases = column_weights(self.wqkv, x.dtype, 3)  # Wqkv's query, key and value columns
        k, v, _ = shared_input_projections(self.normed(x, mesh), kernels[1:], None if biases is None else biases[1:],
                                           target_platform(mesh) == "gpu")
        k, v = ops.reshape(k, heads), ops.reshape(v, heads)
        picked = one_hot_rows(x, rows)
        q = ops.matmul(self.normed(picked, mesh), kernels[0])
        q = q if biases is None else add_bias(q, biases[0], target_platform(mesh) == "gpu")
        q = apply_rotary(ops.reshape(q, heads), at_rows(cos, rows), at_rows(sin, rows))
        say_path("explicit for the last layer's predicted rows")
        context = explicit_attention(q, apply_rotary(k, cos, sin), v,
                                     attention_mask(attend, documents, self.window, rows=rows), self.probs_dropout,
                                     training, float32_scores=True)
        return self.after_attention(picked, ops.reshape(context, picked.shape), training, mesh)


class PretrainingModernBert(keras.Model):
    """``[input_ids, segment_ids, masked_lm_positions]`` -> ``[mlm_logits]`` (float32 ``[batch, predictions,
    vocab]``): :class:`.model.PretrainingBert`'s contract. ``segment_ids`` are accepted and ignored (ModernBERT
    has no token types); the head, and the last layer but for its keys and values (:meth:`encode_rows`), run at the
    masked positions only. ``attention``: one of :data:`.attention.ATTENTION_PATHS` (default:
    ``TPU_PRETRAIN_ATTENTION``, else ``auto``); ``document_separator`` and ``data_mesh`` as in
    :class:`.model.PretrainingBert`."""

    document_separator: int | None = None
    data_mesh = None
    last_block_at_rows = True  # False: every layer at every position, the masked rows gathered after (the tests)

    def __init__(self, config: ModernBertConfig, dtype=None, attention: str | None = None, **kwargs):
        super().__init__(name="modernbert", dtype=dtype, **kwargs)
        make = _Make(config, dtype)
        self.config, self.attention, self.with_nsp = config, attention_path(attention), False
        h = config.hidden_size
        self.token_embedding = TokenEmbedding(
            config.vocab_size, h, embeddings_initializer=keras.initializers.TruncatedNormal(stddev=make.std_in),
            name="tok_embeddings", dtype=dtype)
        self.embedding_norm = make.norm("embedding_norm")
        self.embedding_dropout = make.dropout(config.embedding_dropout)
        self.blocks = [ModernBertLayer(config, make, i, self.attention, name=f"layer_{i}")
                       for i in range(config.num_hidden_layers)]
        self.final_norm = make.norm("final_norm")
        self.head_dense = make.dense(h, "head_dense", config.classifier_bias, make.std_out)
        self.head_activation = activation(config.classifier_activation)
        self.head_norm = make.norm("head_norm")
        self.decoder = None if config.tie_word_embeddings else make.dense(
            config.vocab_size, "decoder", config.decoder_bias, make.std_out)
        self.decoder_bias = TiedLogits(config.vocab_size, name="decoder_bias", dtype=dtype) if (
            config.tie_word_embeddings and config.decoder_bias) else None

    def embed(self, input_ids, training=False):
        """The normalised token embeddings, which tokens attend, their documents (None: together) and each
        attention base's rotary tables."""
        config, length = self.config, input_ids.shape[1]
        x = self.token_embedding(input_ids, float32_gather=target_platform(self.data_mesh) == "gpu")
        x = self.embedding_dropout(self.embedding_norm(x, mesh=self.data_mesh), training=training)
        attend = input_ids != config.pad_token_id
        if config.pad_token_id != 0:
            attend = attend & before_zero_tail(input_ids)
        tables = {theta: rotary_tables(length, config.head_size, theta)
                  for theta in (config.global_rope_theta, config.local_rope_theta)}
        documents = None
        if self.document_separator is not None:
            documents = document_ids(input_ids, attend, self.document_separator)
            positions = document_positions(documents)
            tables = {theta: (jnp.asarray(cos)[positions], jnp.asarray(sin)[positions])
                      for theta, (cos, sin) in tables.items()}
        return x, attend, documents, tables

    def layer(self, block, x, embedded, training=False, rows=None):
        """``block`` (one of :attr:`blocks`) on ``x``, with its attention base's rotary tables."""
        _, attend, documents, tables = embedded
        config = self.config
        cos, sin = tables[config.global_rope_theta if block.is_global else config.local_rope_theta]
        return block(x, attend, documents, cos, sin, training=training, mesh=self.data_mesh, rows=rows)

    def encode(self, input_ids, segment_ids=None, training=False):
        """The last hidden states ``[batch, length, hidden]``, after the final norm."""
        embedded = self.embed(input_ids, training)
        x = embedded[0]
        for block in self.blocks:
            x = self.layer(block, x, embedded, training)
        return self.final_norm(x, mesh=self.data_mesh)

    def encode_rows(self, input_ids, rows, training=False):
        """The last hidden states at ``rows`` (``[batch, n]`` positions): :meth:`encode`'s gathered, with the last
        layer computed at those rows only (:meth:`ModernBertLayer.call_at_rows`) where they are fewer than the
        positions and :attr:`last_block_at_rows`."""
        if not (self.last_block_at_rows and rows.shape[1] < input_ids.shape[1]):
            return one_hot_rows(self.encode(input_ids, None, training), rows)
        embedded = self.embed(input_ids, training)
        x = embedded[0]
        for block in self.blocks[:-1]:
            x = self.layer(block, x, embedded, training)
        return self.final_norm(self.layer(self.blocks[-1], x, embedded, training, rows), mesh=self.data_mesh)

    def call(self, inputs, training=False):
        input_ids, segment_ids, positions = inputs
        gathered = self.encode_rows(input_ids, ops.cast(positions, "int32"), training)
        x = self.head_norm(self.head_activation(self.head_dense(gathered)), mesh=self.data_mesh)
        if self.decoder is not None:
            return [ops.cast(self.decoder(x), "float32")]
        padded = training and pads_logits(self.data_mesh)
        tied = tied_logits if self.decoder_bias is None else self.decoder_bias  # no bias: tied_logits' default
        return [ops.cast(tied(x, self.token_embedding.embeddings, padded=padded), "float32")]


def build_modernbert(config: ModernBertConfig, max_seq_length: int, max_predictions_per_seq: int, dtype=None,
                     attention: str | None = None) -> PretrainingModernBert:
    """The model with its weights created by one symbolic call (shapes only), as :func:`.model.build_model`."""
    config.check_sequence_length(max_seq_length)
    model = PretrainingModernBert(config, dtype=dtype, attention=attention)
    tokens = keras.KerasTensor((1, max_seq_length), "int32")
    model([tokens, tokens, keras.KerasTensor((1, max_predictions_per_seq), "int32")])
    return model


def _linear(out: dict, name: str, layer) -> None:
    out[f"{name}.weight"] = layer.kernel
    if layer.use_bias:
        out[f"{name}.bias"] = layer.bias


def _norm(out: dict, name: str, layer) -> None:
    out[f"{name}.weight"] = layer.gamma
    if layer.center:
        out[f"{name}.bias"] = layer.beta


def hf_variables(model: PretrainingModernBert) -> dict[str, keras.Variable]:
    """Every weight of the model under its ``ModernBertForMaskedLM`` state-dict name. Linear kernels are Keras's
    ``[in, out]`` (transformers stores ``[out, in]``: see :func:`to_hf`); a tied decoder has no entry of its own."""
    out = {EMBEDDINGS: model.token_embedding.embeddings}
    _norm(out, "model.embeddings.norm", model.embedding_norm)
    for i, block in enumerate(model.blocks):
        prefix = f"model.layers.{i}."
        if block.attn_norm is not None:
            _norm(out, f"{prefix}attn_norm", block.attn_norm)
        _linear(out, f"{prefix}attn.Wqkv", block.wqkv)
        _linear(out, f"{prefix}attn.Wo", block.attn_out)
        _norm(out, f"{prefix}mlp_norm", block.mlp_norm)
        _linear(out, f"{prefix}mlp.Wi", block.wi)
        _linear(out, f"{prefix}mlp.Wo", block.mlp_out)
    _norm(out, "model.final_norm", model.final_norm)
    _linear(out, "head.dense", model.head_dense)
    _norm(out, "head.norm", model.head_norm)
    if model.decoder is not None:
        _linear(out, "decoder", model.decoder)
    elif model.decoder_bias is not None:
        out["decoder.bias"] = model.decoder_bias.bias
    return out


def to_hf(name: str, value: np.ndarray) -> np.ndarray:
    """A model array in transformers' layout: Linear kernels transposed to ``[out, in]``."""
    return value.T if value.ndim == 2 and name != EMBEDDINGS else value


def check_tied_decoder(weights: dict[str, np.ndarray], values: dict, variables: dict, source: str) -> None:
    """A ``decoder.weight`` given to a tied model must equal the embeddings it is tied to (the ones being loaded,
    else the model's own)."""
    if DECODER in weights and DECODER not in variables:
        tied = values.get(EMBEDDINGS, np.asarray(variables[EMBEDDINGS].value, np.float32))
        if np.shape(weights[DECODER]) != tied.shape or not np.array_equal(np.asarray(weights[DECODER], np.float32),
                                                                          tied):
            raise UserInputError(f"{source}: {DECODER} differs from {EMBEDDINGS}, but this model ties them "
                                 "(tie_word_embeddings); build it with tie_word_embeddings false.")
