"""What a run trains when its model_size disagrees with its init checkpoint's shape (issue 37, item 15): the
checkpoint's shape, said, and a config.json that records no other size. (A run continued as another model family:
test_bpe_tokenizer.py.)"""

import json
import logging

import pytest
from fault_injection import sample_data

from tpu_pretrain.config import Config
from tpu_pretrain.core.resolve import RunPlan
from tpu_pretrain.core.run_folder import RunFolder
from tpu_pretrain.data.vocab import load_vocab
from tpu_pretrain.errors import UserInputError
from tpu_pretrain.models.bert_config import bert_config_for_size
from tpu_pretrain.models.modernbert_config import modernbert_config_for_size


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """MLM-only data (what both families train) and its vocab.txt."""
    root = tmp_path_factory.mktemp("shape")
    sample_data(root, max_chars=30_000, num_shards=1, workers=1, vocab_size=1200, recipe="modern", eval_fraction=0.01)
    return root


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_a_model_size_beside_a_checkpoint_of_another_shape_is_said_and_not_recorded(data, tmp_path, family, caplog):
    checkpoint = tmp_path / "released"
    checkpoint.mkdir()
    tokens = load_vocab(data / "vocab.txt")
    if family == "bert":
        bert_config_for_size("L4-H256", len(tokens)).to_json_file(checkpoint / "bert_config.json")
    else:
        ids = {name: tokens.index(token) for name, token in (("pad_token_id", "[PAD]"), ("cls_token_id", "[CLS]"),
                                                              ("sep_token_id", "[SEP]"), ("mask_token_id", "[MASK]"),
                                                              ("bos_token_id", "[CLS]"), ("eos_token_id", "[SEP]"))}
        modernbert_config_for_size("L4-H256", len(tokens), 512, **ids).to_json_file(checkpoint / "config.json")
    caplog.set_level(logging.WARNING, logger="tpu_pretrain")
    plan = RunPlan.resolve(Config.load(data_dir=str(data / "data"), output_dir=str(tmp_path / "run"),
                                       model_family=family, model_size="L2-H128", init_checkpoint=str(checkpoint)))
    assert (plan.model_config.num_hidden_layers, plan.model_config.hidden_size) == (4, 256)  # the checkpoint's
    assert f"model_size L2-H128 is not the shape of init_checkpoint {checkpoint} (4 layers, hidden 256" in caplog.text
    run = RunFolder(tmp_path / "run")
    run.write_run_files(plan.config, plan.model_config, plan.vocab)
    assert json.loads(run.config_file.read_text())["model"]["model_size"] == ""  # not the size it does not train
    caplog.clear()
    same = RunPlan.resolve(Config.load(data_dir=str(data / "data"), output_dir=str(tmp_path / "run2"),
                                       model_family=family, model_size="L4-H256", init_checkpoint=str(checkpoint)))
    assert same.config.model.model_size == "L4-H256" and "is not the shape" not in caplog.text


def test_a_bert_built_from_a_size_takes_the_recipes_activation_and_one_from_a_file_its_own(data, tmp_path):
    """The modern recipe's tanh GELU (``gelu_new``) for a model_size; ``hidden_act`` given chooses; a
    bert_config_file keeps the activation it names whatever the recipe (it is the model's definition)."""
    def activation(**settings):
        config = Config.load(data_dir=str(data / "data"), output_dir=str(tmp_path / "run"), **settings)
        return RunPlan.resolve(config).model_config.hidden_act

    assert activation(model_size="L2-H128") == "gelu_new"
    assert activation(model_size="L2-H128", hidden_act="gelu") == "gelu"
    shape = tmp_path / "bert_config.json"
    bert_config_for_size("L2-H128", len(load_vocab(data / "vocab.txt"))).to_json_file(shape)
    assert json.loads(shape.read_text())["hidden_act"] == "gelu"
    assert activation(bert_config_file=str(shape)) == "gelu"


def test_a_run_from_before_the_activation_setting_continues_with_the_gelu_it_trained(data, tmp_path):
    """A run whose config.json has no ``hidden_act`` trained BERT's exact GELU: continued, it keeps it (the recipe's
    tanh GELU would be another model, and the run's identity refuses it), and records it from then on."""
    from tpu_pretrain.core.run_folder import continued_config, run_identity

    output_dir = str(tmp_path / "run")
    old = RunPlan.resolve(Config.load(data_dir=str(data / "data"), output_dir=output_dir, model_size="L2-H128",
                                      hidden_act="gelu"))
    run = RunFolder(output_dir)
    run.write_run_files(old.config, old.model_config, old.vocab)
    run.record_identity(run_identity(old.config, old.model_config, old.data))
    recorded = json.loads(run.config_file.read_text())
    del recorded["model"]["hidden_act"]  # as the run's config.json was written before the setting existed
    run.config_file.write_text(json.dumps(recorded))

    plan = RunPlan.resolve(continued_config({"output_dir": output_dir}))
    assert plan.model_config.hidden_act == "gelu"
    run.check_can_resume(run_identity(plan.config, plan.model_config, plan.data))
    run.write_run_files(plan.config, plan.model_config, plan.vocab)
    assert json.loads(run.config_file.read_text())["model"]["hidden_act"] == "gelu"

    new = RunPlan.resolve(Config.load(data_dir=str(data / "data"), output_dir=output_dir, model_size="L2-H128"))
    with pytest.raises(UserInputError, match="model hidden_act: 'gelu' in the run, 'gelu_new' now"):
        run.check_can_resume(run_identity(new.config, new.model_config, new.data))
