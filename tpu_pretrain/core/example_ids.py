"""Example ids: which record of which shard, in which epoch, one training example is.

Both backends number their training examples alike, so ``logs/example_ids.jsonl`` means the same on either
and dynamic masks (keyed by (seed, example id)) are the same for the same record in the same epoch.
"""

EPOCH_SHIFT, FILE_SHIFT = 48, 32  # id = epoch << 48 | shard index (name order) << 32 | record index in the shard


def example_id(epoch, shard, record):
    """The id of ``record`` of shard ``shard`` read in ``epoch``: ints, NumPy or TensorFlow int64 alike."""
    return epoch * (1 << EPOCH_SHIFT) + shard * (1 << FILE_SHIFT) + record
