"""Documents in packed rows, as model math: which document each token belongs to and its position within it.

A packed row is ``[CLS] doc1 [SEP] doc2 [SEP] ... [SEP] [PAD]...`` (:class:`..data.instances.SequencePacker`): the
[SEP] that ends each document is all the shards say about documents, and [SEP] is never masked nor drawn as a
random replacement, so the ids after masking still show them. Old data folders need no new feature. The models
(:mod:`.model`, :mod:`.modernbert`) keep the documents apart with these; whether a run does is the run's setting
(:func:`.input.document_separator`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def document_ids(input_ids, attend, separator: int | None):
    """``[batch, length]`` int32: the document of each token (1, 2, ...; a document owns the [SEP] that ends it,
    the first owns [CLS]), 0 at padding (``attend`` False), a segment of its own. ``separator`` None: one document
    per row (the attention of a run without document masks)."""
    attend = jnp.asarray(attend)
    if separator is None:
        return attend.astype(jnp.int32)
    ends = (jnp.asarray(input_ids) == separator).astype(jnp.int32)
    before = jnp.cumsum(ends, axis=1) - ends  # the [SEP]s strictly before each position
    return jnp.where(attend, before + 1, 0).astype(jnp.int32)


def document_positions(documents):
    """``[batch, length]`` int32: each token's position within its document (0 at a document's first token), so
    a document packed second gets the positions it would get alone."""
    positions = jnp.arange(documents.shape[1], dtype=jnp.int32)[None, :]
    starts = jnp.concatenate([jnp.ones_like(documents[:, :1], bool), documents[:, 1:] != documents[:, :-1]], axis=1)
    first = jax.lax.cummax(jnp.where(starts, positions, 0), axis=1)
    return positions - first
