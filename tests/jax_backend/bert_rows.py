"""A tiny BERT's batch (documents, padding, repeated and missing predictions) and its outputs with every weight's
gradient under a loss that reads all of them: what the tests of the model's forms compare, form against form; and
the tiny BERT whose every weight, biases included, is off its initial value (:func:`model_with_biases`)."""

import jax
import jax.numpy as jnp
import numpy as np

from tpu_pretrain.jax_backend.model import build_model
from tpu_pretrain.models.bert_config import bert_config_for_size

SEP, B, T, P = 3, 4, 32, 5


def batch():
    """Two documents per row (a [SEP] at 10), rows padded after 20 and 5 tokens; the positions a data folder gives:
    real tokens, some repeated, and 0 where a row has fewer predictions (their weight is 0)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 300, (B, T)).astype(np.int32)
    ids[:, 10] = SEP
    ids[1, 20:] = 0
    ids[2, 5:] = 0
    positions = np.array([[1, 2, 11, 12, 0], [3, 15, 19, 0, 0], [1, 2, 0, 0, 0], [31, 30, 12, 9, 9]], np.int32)
    return ids, np.zeros((B, T), np.int32), positions


def outputs_and_gradients(model, at_rows: bool = True, length: int = T):
    """``model``'s outputs on :func:`batch` (padded to ``length`` tokens) and each trainable weight's gradient; its
    last block at the loss's rows (the package's way) or whole."""
    ids, segments, positions = batch()
    ids, segments = (np.pad(a, ((0, 0), (0, length - T))) for a in (ids, segments))
    model.last_block_at_rows = at_rows
    (_, out), grads = jax.value_and_grad(loss_of_weights(model, [ids, segments, positions]), has_aux=True)(
        [v.value for v in model.trainable_variables])
    return out, grads


def loss_of_weights(model, inputs):
    """``loss(weights) -> (loss, outputs)``: ``model`` on ``inputs`` with its trainable weights ``weights``, under a
    loss that reads every output."""
    non_trainable = [v.value for v in model.non_trainable_variables]

    def loss(weights):
        out, _ = model.stateless_call(weights, non_trainable, inputs)
        return sum(jnp.sum(jnp.sin(o.astype(jnp.float32))) for o in out), out

    return loss


def model_with_biases(path: str, length: int, attention_dropout: float = 0.0):
    """A float32 L2-H128 BERT (two heads) on ``path``, documents apart, every weight moved off its initial value
    (BERT's biases start at 0, where moving one changes nothing)."""
    config = bert_config_for_size("L2-H128", 300)
    config.num_attention_heads = 2
    config.hidden_dropout_prob, config.attention_probs_dropout_prob = 0.0, attention_dropout
    model = build_model(config, length, P, dtype="float32", attention=path)
    model.document_separator = SEP
    rng = np.random.default_rng(3)
    for variable in model.trainable_variables:
        variable.assign(variable.value + rng.normal(0.0, 0.05, variable.shape).astype(np.float32))
    return model
