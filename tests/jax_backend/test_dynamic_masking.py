"""Dynamic masking in NumPy, as the JAX backend's input applies it (:mod:`tpu_pretrain.data.dynamic_masking`):
the rule of the TensorFlow backend's ``dynamic_mask`` (whose own test this mirrors), on batches of real
create-data shards, each example's masks a pure function of (train_seed, example id), so a resumed input
re-masks exactly. Imports neither framework: it runs in both test environments. The draws themselves are
compared with TensorFlow's in distribution in test_parity.py.
"""

import numpy as np
import pytest
from fault_injection import sample_data

from tpu_pretrain.data.data_folder import read_data_info
from tpu_pretrain.data.dynamic_masking import DynamicMasking, dynamic_mask
from tpu_pretrain.data.vocab import Vocab  # noqa: E402
from tpu_pretrain.jax_backend.input import TrainingBatches

B, T, P = 32, 64, 10


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    data_dir = sample_data(tmp_path_factory.mktemp("masking"), max_chars=30_000, num_shards=2, workers=1)
    info = read_data_info(data_dir)
    return info.train_files, DynamicMasking.from_vocab(Vocab.read(f"{data_dir}/vocab.txt"))


def batches(files, masking=None, start_record=0, count=3, seed=3):
    reader = TrainingBatches(files, B, T, P, seed=seed, start_record=start_record, masking=masking)
    try:
        return [next(reader) for _ in range(count)]
    finally:
        reader.close()


def originals(features: dict) -> np.ndarray:
    """The sequences with the stored masks undone."""
    ids = features["input_ids"].copy()
    rows, slots = np.nonzero(features["masked_lm_weights"] > 0)
    ids[rows, features["masked_lm_positions"][rows, slots]] = features["masked_lm_ids"][rows, slots]
    return ids


def test_masks_real_tokens_only_with_80_10_10(data):
    files, spec = data
    static, dynamic = batches(files), batches(files, spec)
    masked = kept = drawn = 0
    for (ids, stored), (same_ids, out) in zip(static, dynamic, strict=True):
        np.testing.assert_array_equal(same_ids, ids)  # masking changes no example's place
        original, real = originals(stored), stored["input_mask"] > 0
        np.testing.assert_array_equal(originals(out), original)  # the new masks are undone to the same text
        for b in range(B):
            weights = out["masked_lm_weights"][b]
            chosen = out["masked_lm_positions"][b][weights > 0]
            candidates = int((real[b] & (original[b] != spec.cls_id) & (original[b] != spec.sep_id)).sum())
            assert len(chosen) == min(max(1, round(candidates * 0.15)), P, candidates)
            assert list(chosen) == sorted(set(chosen)) and np.all(weights[len(chosen):] == 0)  # unused slots last
            assert all(real[b, p] and original[b, p] not in (spec.cls_id, spec.sep_id) for p in chosen)
            labels = out["masked_lm_ids"][b][weights > 0]
            np.testing.assert_array_equal(labels, original[b, chosen])
            untouched = np.setdiff1d(np.arange(T), chosen)
            np.testing.assert_array_equal(out["input_ids"][b, untouched], original[b, untouched])
            written = out["input_ids"][b, chosen]
            masked += int((written == spec.mask_id).sum())
            kept += int((written == labels).sum())
            random = written[(written != spec.mask_id) & (written != labels)]
            assert set(random.tolist()) <= set(spec.replacement_ids.tolist())  # never special or [unusedN]
            drawn += len(random)
        assert not np.array_equal(out["masked_lm_positions"], stored["masked_lm_positions"])  # masked afresh
    total = masked + kept + drawn
    print(f"[MASK] {masked / total:.3f}, kept {kept / total:.3f}, random {drawn / total:.3f} of {total}")
    assert total > 500 and abs(masked / total - 0.8) < 0.05 and abs(kept / total - 0.1) < 0.04


def test_masks_are_a_pure_function_of_seed_and_example_id(data):
    files, spec = data
    first = batches(files, spec, count=4)
    # A resumed input (opened at record 2 * B + 5, mid-batch) re-masks every example as the first reading did.
    resumed = batches(files, spec, start_record=2 * B + 5, count=1)[0]
    ids = np.concatenate([first[2][0][5:], first[3][0][:5]])
    np.testing.assert_array_equal(resumed[0], ids)
    for key in ("input_ids", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights"):
        expected = np.concatenate([first[2][1][key][5:], first[3][1][key][:5]])
        np.testing.assert_array_equal(resumed[1][key], expected, err_msg=key)
    # Another seed, or the same record in another epoch (another example id), draws other masks.
    ids, features = first[0]
    other_seed = dynamic_mask(features, ids, 4, spec)
    next_epoch = dynamic_mask(features, ids + (1 << 48), 3, spec)
    again = dynamic_mask(features, ids, 3, spec)
    np.testing.assert_array_equal(again["input_ids"], features["input_ids"])
    for other in (other_seed, next_epoch):
        assert (other["masked_lm_positions"] != features["masked_lm_positions"]).any(axis=1).mean() > 0.8
