"""The BERT pretraining model, built with bert4keras (its shape: :mod:`..models.bert_config`; its weights by
name: :mod:`.weights`).

Why not bert4keras's own ``with_mlm=True`` head: it computes full-vocabulary logits for every token,
which costs ~25% of a BERT-base step and a [batch, length, vocab] softmax. Like the original BERT we
gather the hidden states at ``masked_lm_positions`` first, then apply the tied-embedding MLM head.
We also give every weight matrix its own random draw (bert4keras hands one initializer object to the
Q, K, V and output kernels, and an unseeded tf-keras initializer repeats its values), and draw every
dropout mask from a stateless stream keyed by (seed, step, replica, micro-batch, layer), which the
trainer opens with :func:`dropout_seed`: a resumed run drops exactly what an uninterrupted one drops.
"""

from __future__ import annotations

import sys
import threading
import zlib
from contextlib import contextmanager
from dataclasses import dataclass

from ..environment import EnvironmentSetupError, check_dependencies
from .framework import tf

check_dependencies()  # before bert4keras: a missing or mismatched install is named with its fix
if getattr(sys.modules.get("keras"), "__version__", "2").startswith("3"):
    raise EnvironmentSetupError("Keras 3 (the JAX backend's) is already loaded in this process, and bert4keras needs "
                                "the name keras for tf-keras: use the TensorFlow backend in a new Python process "
                                "(or restart the notebook kernel).")

from bert4keras.backend import align, attention_normalize
from bert4keras.layers import Dense, Dropout, Embedding, Lambda, LayerNormalization, MultiHeadAttention, ScaleOffset
from bert4keras.models import BERT

from ..models.bert_config import TANH_GELU_NAMES, BertConfig

keras = tf.keras


class FreshTruncatedNormal(keras.initializers.Initializer):
    """BERT's truncated normal that draws new values on every call.

    tf-keras's unseeded initializers return the same values each time one object is called, and
    bert4keras calls one object for several kernels. This one uses the stateful global RNG, so the
    draws differ per call and are reproducible after ``tf.keras.utils.set_random_seed``.
    """

    def __init__(self, stddev: float = 0.02):
        self.stddev = stddev

    def __call__(self, shape, dtype=None, **kwargs):
        dtype = tf.as_dtype(dtype or keras.backend.floatx())
        return tf.random.truncated_normal(shape, stddev=self.stddev, dtype=dtype)

    def get_config(self):
        return {"stddev": self.stddev}


_SEED = threading.local()  # per thread: MirroredStrategy traces each replica in a thread of its own


@contextmanager
def dropout_seed(seed):
    """Draw the dropout masks of model calls traced inside the block from ``seed`` (an int64 [2] tensor)."""
    previous = getattr(_SEED, "value", None)
    _SEED.value = seed
    try:
        yield
    finally:
        _SEED.value = previous


def seeded_dropout(inputs, rate: float, key: str, training):
    """Stateless dropout keyed by the open :func:`dropout_seed` and ``key`` (a layer's name); None when no
    seed is open (the caller then drops with Keras's own stateful random stream)."""
    seed = getattr(_SEED, "value", None)
    if seed is None or training is None:
        return None
    if not training or not rate:
        return tf.identity(inputs)
    layer_seed = tf.random.experimental.stateless_fold_in(seed, tf.constant(zlib.crc32(key.encode()), tf.int64))
    return tf.nn.experimental.stateless_dropout(inputs, rate=rate, seed=layer_seed)


class SeededDropout(Dropout):
    """Keras Dropout whose masks come from :func:`dropout_seed` when one is open."""

    def call(self, inputs, training=None):
        dropped = seeded_dropout(inputs, self.rate, self.name, training)
        return super().call(inputs, training=training) if dropped is None else dropped


class TiedEmbedding(Embedding):
    """bert4keras's token table, whose ``dense`` mode (the tied MLM head) reads the table in the inputs' dtype: under
    ``mixed_float16`` the table stays float32 (tf-keras does not autocast an Embedding's variables) and bert4keras's
    own product of float16 activations by it failed to build (TypeError in MatMul), so float16 could not train."""

    def call(self, inputs, mode="embedding"):
        if mode == "embedding":
            return super().call(inputs)
        kernel = tf.cast(self.embeddings, inputs.dtype)  # the variable itself where the dtypes agree
        return keras.backend.dot(inputs, tf.transpose(kernel))  # bert4keras's product, as before


class SeededAttention(MultiHeadAttention):
    """bert4keras's multi-head attention (BERT's case: no position bias) with its attention-probability
    dropout drawn from :func:`dropout_seed`; other cases are bert4keras's own."""

    def pay_attention_to(self, inputs, mask=None, **kwargs):
        training = kwargs.get("training")  # Keras hands it to call(**kwargs), which hands it on
        if kwargs.get("p_bias") or not self.attention_dropout or training is None or \
                getattr(_SEED, "value", None) is None:
            return super().pay_attention_to(inputs, mask, **kwargs)
        qw, kw, vw = inputs[:3]
        a_bias = inputs[3] if kwargs.get("a_bias") else None
        a = tf.einsum("bjhd,bkhd->bhjk", qw, kw)
        if self.attention_scale:
            a = a / self.key_size**0.5
        if a_bias is not None and tf.keras.backend.ndim(a_bias) == 3:
            a_bias = align(a_bias, [0, -2, -1], tf.keras.backend.ndim(a))
        probabilities = attention_normalize(a, mask[1], -1, self.normalization, a_bias)
        probabilities = seeded_dropout(probabilities, self.attention_dropout, f"{self.name}/probabilities", training)
        return tf.einsum("bhjk,bkhd->bjhd", probabilities, vw), a


def _gather_positions(inputs):
    """[batch, length, hidden] at [batch, predictions] positions -> [batch, predictions, hidden]."""
    sequence, positions = inputs
    return tf.gather(sequence, tf.cast(positions, tf.int32), batch_dims=1)


class PretrainingBERT(BERT):
    """bert4keras BERT whose heads are the original pretraining heads (MLM at masked positions, NSP).

    Outputs logits (no softmax) so the loss is computed stably in float32. Layer names follow
    bert4keras, so its ``variable_mapping()`` (Google's variable names) covers the heads too.
    """

    def __init__(self, initializer_range: float = 0.02, with_nsp_head: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.initializer_range = initializer_range
        self.with_nsp_head = with_nsp_head

    @property
    def initializer(self):
        return FreshTruncatedNormal(self.initializer_range)

    def apply(self, inputs=None, layer=None, arguments=None, **kwargs):
        """bert4keras's layer factory, with dropout and attention whose masks follow :func:`dropout_seed`."""
        if layer is MultiHeadAttention:
            layer = SeededAttention
        elif layer is Embedding:
            layer = TiedEmbedding
        elif layer is Dropout and self.dropout_rate:
            layer = SeededDropout
        return super().apply(inputs=inputs, layer=layer, arguments=arguments, **kwargs)

    def apply_final_layers(self, inputs):
        sequence = inputs
        self.sequence_output = sequence
        positions = self.inputs[-1]
        x = self.apply(inputs=[sequence, positions], layer=Lambda, function=_gather_positions,
                       name="MLM-Gather")
        x = self.apply(inputs=x, layer=Dense, units=self.embedding_size, activation=self.hidden_act,
                       kernel_initializer=self.initializer, name="MLM-Dense")
        x = self.apply(inputs=x, layer=LayerNormalization, epsilon=1e-12, name="MLM-Norm")
        x = self.apply(inputs=x, layer=Embedding, arguments={"mode": "dense"}, name="Embedding-Token")
        mlm_logits = self.apply(inputs=x, layer=ScaleOffset, scale=False, name="MLM-Bias")
        if not self.with_nsp_head:
            return [mlm_logits]
        x = self.apply(inputs=sequence, layer=Lambda, function=lambda t: t[:, 0], name="Pooler")
        x = self.apply(inputs=x, layer=Dense, units=self.hidden_size, activation="tanh",
                       kernel_initializer=self.initializer, name="Pooler-Dense")
        nsp_logits = self.apply(inputs=x, layer=Dense, units=2, kernel_initializer=self.initializer,
                                name="NSP-Proba")  # logits; the name is bert4keras's, for the mapping
        return [mlm_logits, nsp_logits]


@dataclass
class PretrainingModel:
    """The Keras pretraining model, the encoder-only view sharing its weights, and the bert4keras builder.

    ``model`` takes ``[input_ids, segment_ids, masked_lm_positions]`` and returns ``[mlm_logits]``
    (+ ``nsp_logits``); ``encoder`` takes ``[input_ids, segment_ids]`` and returns the last hidden
    states. Padding is read from ``input_ids == 0`` ([PAD] is id 0 in every BERT vocab).
    """

    model: keras.Model
    encoder: keras.Model
    bert: PretrainingBERT
    config: BertConfig
    with_nsp: bool


# bert4keras's names for BERT's activations: its "gelu" is the exact one, the tanh approximation is "gelu_tanh"
BERT4KERAS_ACTIVATIONS = dict.fromkeys(TANH_GELU_NAMES, "gelu_tanh")


def build_pretraining_model(config: BertConfig, max_seq_length: int, max_predictions_per_seq: int,
                            with_nsp: bool = True) -> PretrainingModel:
    """Build (in the current strategy scope) BERT with static shapes, as TPUs need."""
    config.check_sequence_length(max_seq_length)
    bert = PretrainingBERT(
        initializer_range=config.initializer_range,
        with_nsp_head=with_nsp,
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size,
        hidden_act=BERT4KERAS_ACTIVATIONS.get(config.hidden_act, config.hidden_act),
        dropout_rate=config.hidden_dropout_prob,
        attention_dropout_rate=config.attention_probs_dropout_prob,
        max_position=config.max_position_embeddings,
        segment_vocab_size=config.type_vocab_size,
        sequence_length=max_seq_length,
        name="bert",
    )
    positions = keras.layers.Input(shape=(max_predictions_per_seq,), dtype="int32",
                                   name="Input-MLM-Positions")
    bert.build(additional_input_layers=positions)
    encoder = keras.Model(bert.inputs[:2], bert.sequence_output, name="bert_encoder")
    return PretrainingModel(model=bert.model, encoder=encoder, bert=bert, config=config, with_nsp=with_nsp)
