"""MFU figures that cannot be true are called so: a device cannot beat its own peak (issue 37, item 20)."""

import pytest
from fault_injection import sample_data
from numpy_trainer import NumpyTrainer

from tpu_pretrain.config import Config
from tpu_pretrain.core.loop import run_training


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return sample_data(tmp_path_factory.mktemp("mfu_data"), max_chars=20_000, num_shards=1, workers=1)


def test_an_mfu_over_100_percent_says_the_stated_peak_is_wrong_once(data_dir, tmp_path, caplog):
    caplog.set_level("INFO", logger="tpu_pretrain")
    config = Config.load(data_dir=data_dir, output_dir=str(tmp_path / "run"), model_size="L2-H128",
                         train_batch_size=8, num_train_steps=6, num_warmup_steps=1, log_every_steps=2,
                         save_checkpoints_steps=6, eval_every_steps=0, session_hours=-1, peak_tflops=1e-6)
    result = run_training(NumpyTrainer(config), config.storage.output_dir, progress=False)
    assert all(h["mfu"] > 1 for h in result.history)  # every line's MFU is impossible...
    said = [r.getMessage() for r in caplog.records if "is over 100%" in r.getMessage()]
    assert len(said) == 1, said  # ...and said so once, naming the setting to fix
    assert "the stated --peak_tflops 1e-06" in said[0] and "Set --peak_tflops" in said[0]
    assert "stated peak of 1e-06 TFLOP/s" in caplog.text  # not "0.0 TFLOP/s"
