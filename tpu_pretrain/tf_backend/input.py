"""tf.data input for pretraining: BERT-schema TFRecord shards -> per-replica batches with static shapes.

TPUs need static shapes (``drop_remainder``) and int32; every accelerator wants reads that overlap
compute (parallel interleave, prefetch). The order is a pure function of the seed, so the same run
on 1 or N replicas sees the same global batches (replicas take consecutive per-replica batches).
"""

from __future__ import annotations

from ..core.example_ids import example_id
from ..data.data_folder import feature_shapes
from ..data.dynamic_masking import DynamicMasking
from ..errors import UserInputError
from .framework import tf


def feature_spec(max_seq_length: int, max_predictions_per_seq: int) -> dict:
    """The ``tf.io.parse_example`` spec of the data folder's features (the original BERT schema)."""
    return {name: tf.io.FixedLenFeature([length], tf.as_dtype(dtype))
            for name, (dtype, length) in feature_shapes(max_seq_length, max_predictions_per_seq).items()}


def parse_batch(serialized, max_seq_length: int, max_predictions_per_seq: int) -> dict:
    """Parse a batch of records at once (vectorised) and cast int64 to int32, which TPUs prefer."""
    parsed = tf.io.parse_example(serialized, feature_spec(max_seq_length, max_predictions_per_seq))
    out = {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in parsed.items()}
    out["next_sentence_labels"] = tf.reshape(out["next_sentence_labels"], [-1])
    return out


def dynamic_mask(features: dict, seed, spec: DynamicMasking) -> dict:
    """Re-mask a batch (RoBERTa-style): restore the original tokens, then mask afresh with 80/10/10
    (the rule of :mod:`..data.dynamic_masking`, whose NumPy twin the JAX backend uses).

    Token-level masking of real tokens ([CLS], [SEP] and padding excluded), up to the record's
    max_predictions_per_seq; ``seed`` is a stateless seed pair, so the masks are reproducible.
    """
    ids, positions = features["input_ids"], features["masked_lm_positions"]
    seq_len, max_pred = ids.shape[-1], positions.shape[-1]
    valid = tf.cast(features["masked_lm_weights"] > 0, tf.int32)
    hits = tf.one_hot(positions, seq_len, dtype=tf.int32) * valid[..., None]  # [B, P, T]
    restored = tf.reduce_sum(hits * features["masked_lm_ids"][..., None], axis=1)
    ids = tf.where(tf.reduce_max(hits, axis=1) > 0, restored, ids)

    candidates = (features["input_mask"] > 0) & (ids != spec.cls_id) & (ids != spec.sep_id)
    n_candidates = tf.reduce_sum(tf.cast(candidates, tf.float32), axis=1)
    n_mask = tf.cast(tf.round(n_candidates * spec.masked_lm_prob), tf.int32)
    n_mask = tf.minimum(tf.maximum(n_mask, 1), tf.minimum(max_pred, tf.cast(n_candidates, tf.int32)))
    seeds = tf.random.experimental.stateless_split(seed, 3)
    scores = tf.where(candidates, tf.random.stateless_uniform(tf.shape(ids), seeds[0]), -1.0)
    _, picked = tf.math.top_k(scores, k=max_pred)
    keep = tf.range(max_pred)[None, :] < n_mask[:, None]
    picked = tf.sort(tf.where(keep, picked, seq_len), axis=1)  # ascending, unused slots last
    keep = picked < seq_len
    new_positions = tf.where(keep, picked, 0)
    labels = tf.gather(ids, new_positions, batch_dims=1) * tf.cast(keep, tf.int32)

    choice = tf.random.stateless_uniform(tf.shape(new_positions), seeds[1])
    replacements = tf.constant(spec.replacement_ids, tf.int32)
    random_tokens = tf.gather(replacements, tf.random.stateless_uniform(
        tf.shape(new_positions), seeds[2], minval=0, maxval=len(spec.replacement_ids), dtype=tf.int32))
    replacement = tf.where(choice < 0.8, spec.mask_id, tf.where(choice < 0.9, labels, random_tokens))
    writes = tf.one_hot(new_positions, seq_len, dtype=tf.int32) * tf.cast(keep, tf.int32)[..., None]
    written = tf.reduce_sum(writes * replacement[..., None], axis=1)
    out = dict(features)
    out["input_ids"] = tf.where(tf.reduce_max(writes, axis=1) > 0, written, ids)
    out["masked_lm_positions"] = new_positions
    out["masked_lm_ids"] = labels
    out["masked_lm_weights"] = tf.cast(keep, tf.float32)
    return out


def training_records(files: list[str], *, seed: int, shuffle_buffer_size: int, start_record: int = 0,
                     records_per_epoch: int | None = None) -> tf.data.Dataset:
    """``(example_id, serialized record)`` in an order that is a pure function of the seed.

    Epoch ``e`` reads the files in a stateless shuffle of ``(seed, e)`` through a deterministic
    interleave, then permutes records within windows by stateless shuffles, so any position can be
    recomputed. Resuming at
    ``start_record`` (records already consumed, from the checkpointed step) skips whole epochs by
    arithmetic on the manifest's record count and reads at most one epoch to reach the offset:
    the resumed run neither repeats nor skips an example.
    """
    paths = tf.constant(sorted(files))
    count = len(files)
    cycle = min(count, 8)

    def read_file(epoch, file_index):
        records = tf.data.TFRecordDataset(tf.gather(paths, file_index))
        return records.enumerate().map(lambda i, record: (example_id(epoch, file_index, i), record))

    def epoch_records(epoch):
        order = tf.random.experimental.stateless_shuffle(tf.range(count, dtype=tf.int64),
                                                         seed=tf.stack([tf.constant(seed, tf.int64), epoch]))
        ds = tf.data.Dataset.from_tensor_slices(order).interleave(
            lambda i: read_file(epoch, i), cycle_length=cycle, block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        if shuffle_buffer_size <= 1:
            return ds
        # Records are shuffled within windows of shuffle_buffer_size by a stateless permutation keyed by
        # (seed, epoch, window): unlike a seeded shuffle buffer, every epoch gets its own order.
        def permute(window_index, window):
            key = tf.stack([tf.constant(seed, tf.int64), epoch * (1 << 20) + window_index])
            order = tf.random.experimental.stateless_shuffle(tf.range(tf.shape(window[0])[0]), seed=key)
            return tf.data.Dataset.from_tensor_slices((tf.gather(window[0], order), tf.gather(window[1], order)))

        return ds.batch(shuffle_buffer_size).enumerate().flat_map(lambda i, w: permute(i, w))

    start_epoch, offset = 0, start_record
    if start_record:
        per_epoch = records_per_epoch or count_records(files)
        start_epoch, offset = divmod(start_record, per_epoch)
    ds = tf.data.Dataset.range(start_epoch, 1 << 15).flat_map(epoch_records)
    return ds.skip(offset) if offset else ds


def count_records(files: list[str]) -> int:
    """Records in the shards (when no manifest says): one read through the files."""
    return int(tf.data.TFRecordDataset(sorted(files)).reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))


def make_dataset(files: list[str], *, batch_size: int, max_seq_length: int, max_predictions_per_seq: int,
                 training: bool, seed: int = 0, shuffle_buffer_size: int = 10_000,
                 masking: DynamicMasking | None = None, max_batches: int | None = None,
                 input_context: tf.distribute.InputContext | None = None, start_record: int = 0,
                 records_per_epoch: int | None = None, drop_remainder: bool = True) -> tf.data.Dataset:
    """One input pipeline's batches (``batch_size`` is per replica when distributed).

    Training batches carry ``example_id`` (see :func:`training_records`); ``start_record`` is the
    number of records the whole run has consumed so far (global, over all input pipelines).
    """
    pipelines = input_context.num_input_pipelines if input_context else 1
    pipeline_id = input_context.input_pipeline_id if input_context else 0
    if training:
        ds = training_records(files, seed=seed, shuffle_buffer_size=shuffle_buffer_size, start_record=start_record,
                              records_per_epoch=records_per_epoch)
        if pipelines > 1:  # every pipeline walks the same global order and keeps its share
            ds = ds.shard(pipelines, pipeline_id)
    else:
        ds = tf.data.Dataset.from_tensor_slices(sorted(files)).flat_map(tf.data.TFRecordDataset)
        if pipelines > 1:
            ds = ds.shard(pipelines, pipeline_id)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder or training)  # eval off a TPU: the last one too
    if max_batches:
        ds = ds.take(max_batches)
    if training:
        def parse(ids, serialized):
            batch = parse_batch(serialized, max_seq_length, max_predictions_per_seq)
            batch["example_id"] = ids
            return batch
    else:
        def parse(serialized):
            return parse_batch(serialized, max_seq_length, max_predictions_per_seq)
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if masking is not None and training:
        # Seeded by the batch's first example id: the same masks after a resume, new ones each epoch.
        ds = ds.map(lambda b: dynamic_mask(b, tf.stack([tf.constant(seed, tf.int64), b["example_id"][0]]), masking),
                    num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    options = tf.data.Options()
    options.deterministic = True
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


def distributed_dataset(strategy: tf.distribute.Strategy, files: list[str], global_batch_size: int,
                        max_steps: int | None = None, **kwargs):
    """Split the global batch over the strategy's replicas; each input pipeline reads its own shards.

    ``max_steps`` bounds the global batches (each input pipeline then yields its replicas' share).
    """
    replicas = strategy.num_replicas_in_sync
    if global_batch_size % replicas:
        raise UserInputError(f"The global batch {global_batch_size} is not divisible by the {replicas} "
                             f"replicas; use a multiple of {replicas}.")

    def dataset_fn(context: tf.distribute.InputContext):
        per_pipeline = None
        if max_steps:
            per_pipeline = max(1, max_steps * context.num_replicas_in_sync // context.num_input_pipelines)
        return make_dataset(files, batch_size=context.get_per_replica_batch_size(global_batch_size),
                            input_context=context, max_batches=per_pipeline, **kwargs)

    return strategy.distribute_datasets_from_function(dataset_fn)
