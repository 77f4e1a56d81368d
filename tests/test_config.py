import json

import pytest

from tpu_pretrain.cli import build_parser, config_from_args
from tpu_pretrain.config import Config, ConfigError
from tpu_pretrain.config_checks import max_predictions


def test_the_classic_recipe_keeps_the_original_bert_flag_values():
    config = Config.load(recipe="classic")
    assert config.data.max_seq_length == 128
    assert max_predictions(config.data.max_seq_length, config.data.max_predictions_per_seq,
                           config.data.masked_lm_prob) == 20  # derived from the length, as BERT's 20 for 128
    assert config.data.masked_lm_prob == 0.15
    assert config.data.short_seq_prob == 0.1


def test_flat_keyword_arguments_and_sections():
    config = Config.load(max_seq_length=64, max_predictions_per_seq=10, data={"dupe_factor": 3})
    assert config.data.max_seq_length == 64
    assert config.data.dupe_factor == 3
    assert config.get("max_predictions_per_seq") == 10


def test_unknown_key_suggests_the_close_name():
    with pytest.raises(ConfigError, match="Unknown setting 'max_seq_len'.*Did you mean 'max_seq_length'"):
        Config.load(max_seq_len=128)


def test_unknown_key_in_a_section_is_named():
    with pytest.raises(ConfigError, match="'dupe_factr' in section 'data'.*dupe_factor"):
        Config.from_dict({"data": {"dupe_factr": 2}})


def test_max_predictions_beyond_the_masked_budget_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"max_predictions_per_seq=60 .*set max_predictions_per_seq=20"):
        Config.load(recipe="classic", max_predictions_per_seq=60)
    Config.load(recipe="classic", max_seq_length=512, max_predictions_per_seq=80)  # BERT's own long-sequence one


def test_the_data_has_no_position_limit():
    """Any length is data's to have: the model's positions are checked by train, where the model is known."""
    config = Config.load(max_seq_length=1024, max_predictions_per_seq=0)
    assert (config.data.max_seq_length, config.model.max_position_embeddings) == (1024, 0)  # 0: the family's own
    with pytest.raises(ConfigError, match="max_position_embeddings=-1 .*use 0"):
        Config.load(max_position_embeddings=-1)


def test_types_are_checked_with_the_setting_named():
    with pytest.raises(ConfigError, match="Setting 'dupe_factor' .*'many'"):
        Config.load(dupe_factor="many")
    with pytest.raises(ConfigError, match="unicode_normalization.*choose one of NFKC, NFC, none"):
        Config.load(unicode_normalization="NFKD")


def test_json_and_yaml_files(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"max_seq_length": 256, "max_predictions_per_seq": 40}))
    (tmp_path / "c.yaml").write_text("data:\n  dupe_factor: 4\ndo_lower_case: false\n")
    assert Config.load(tmp_path / "c.json").data.max_seq_length == 256
    config = Config.load(tmp_path / "c.yaml", dupe_factor=7)
    assert config.data.dupe_factor == 7 and config.data.do_lower_case is False
    (tmp_path / "bad.yaml").write_text("data: [1, 2\n")
    with pytest.raises(ConfigError, match="bad.yaml"):
        Config.load(tmp_path / "bad.yaml")


def test_save_and_reload_round_trip(tmp_path):
    config = Config.load(max_seq_length=256, max_predictions_per_seq=40, input=["a.txt"])
    config.save(tmp_path / "config.json")
    assert Config.load(tmp_path / "config.json").to_dict() == config.to_dict()


def test_cli_flags_share_the_configuration_names(tmp_path):
    settings = {"dupe_factor": 3, "max_seq_length": 64, "max_predictions_per_seq": 10}
    (tmp_path / "c.json").write_text(json.dumps(settings))
    args = build_parser().parse_args(
        ["create-data", "--config", str(tmp_path / "c.json"), "--input", "a.txt", "b.txt", "--max_seq_length", "96",
         "--max_predictions_per_seq", "15", "--do_lower_case=false", "--no_nsp"]
    )
    from tpu_pretrain.config import CREATE_DATA, step_settings

    config = config_from_args(args, step_settings(CREATE_DATA))
    assert config.corpus.input == ["a.txt", "b.txt"]
    assert config.data.max_seq_length == 96  # flag overrides the file
    assert config.data.dupe_factor == 3  # the file's value stays when no flag is given
    assert config.data.do_lower_case is False and config.data.no_nsp is True


def test_the_modern_recipe_sets_its_settings_and_explicit_settings_win(tmp_path):
    from tpu_pretrain.config import MODERN_RECIPE, TRAIN, step_settings

    classic, modern = Config.load(recipe="classic"), Config.load(recipe="modern")
    assert all(modern.get(key) == value for key, value in MODERN_RECIPE.items())
    assert classic.data.recipe == "classic" and not classic.data.pack_sequences and classic.train.adam_beta2 == 0.999
    assert modern.data.eval_masked_lm_prob == 0.15  # figures stay comparable with classic runs
    # explicit settings win, given before or after the recipe, in a file or as flags
    for values in ({"masked_lm_prob": 0.25, "recipe": "modern"}, {"recipe": "modern", "masked_lm_prob": 0.25}):
        config = Config.from_dict(values)
        assert config.data.masked_lm_prob == 0.25 and config.data.pack_sequences
    (tmp_path / "modern.yaml").write_text("recipe: modern\nadam_beta2: 0.99\n")
    args = build_parser().parse_args(["train", "--config", str(tmp_path / "modern.yaml"), "--hidden_dropout_prob",
                                      "0.1"])
    config = config_from_args(args, step_settings(TRAIN))
    assert (config.train.adam_beta2, config.model.hidden_dropout_prob, config.train.lr_schedule) == (0.99, 0.1, "wsd")
    # a saved configuration reloads as it was (every setting in it is explicit)
    config.save(tmp_path / "saved.json")
    assert Config.load(tmp_path / "saved.json").to_dict() == config.to_dict()
    # switching back to classic restores what the recipe set, not what was given
    config.set("recipe", "classic")
    assert config.data.masked_lm_prob == 0.15 and config.train.adam_beta2 == 0.99


def test_warmup_and_cooldown_defaults_are_valid_for_any_run_length():
    config = Config.load(num_train_steps=500)  # BERT's fixed 10,000-step warmup refused every run this short
    assert config.train.num_warmup_steps == -1 and config.train.num_cooldown_steps == 0
    with pytest.raises(ConfigError, match="num_warmup_steps=600 .*num_train_steps=500"):
        Config.load(num_train_steps=500, num_warmup_steps=600)


def test_modernbert_implies_the_modern_recipe_unless_a_recipe_or_the_setting_is_given():
    from tpu_pretrain.config import MODERN_RECIPE

    modern = Config.load(model_family="modernbert")
    assert modern.data.recipe == "modern" and all(modern.get(k) == v for k, v in MODERN_RECIPE.items())
    for values in ({"model_family": "modernbert", "recipe": "classic"}, {"recipe": "classic",
                                                                          "model_family": "modernbert"}):
        classic = Config.from_dict(values)
        assert classic.data.recipe == "classic" and classic.train.lr_schedule == "linear"
    given = Config.from_dict({"hidden_dropout_prob": 0.1, "model_family": "modernbert", "adam_beta2": 0.99})
    assert (given.model.hidden_dropout_prob, given.train.adam_beta2, given.train.lr_schedule) == (0.1, 0.99, "wsd")
    assert Config.load(model_family="bert").data.recipe == "modern"  # from scratch: the modern recipe for both
    with pytest.raises(ConfigError, match="model_family.*choose one of bert, modernbert"):
        Config.load(model_family="roberta")


def test_the_recipe_is_modern_from_scratch_and_classic_where_a_bert_release_is_continued(tmp_path, caplog):
    """A newcomer's default is the recommended recipe; a Google/BERT checkpoint continues the way it was trained,
    whichever order the settings come in; a recipe given by name wins; the line at the start says which and why."""
    from tpu_pretrain.config import MODERN_RECIPE, recipe_line

    scratch = Config.load()
    assert scratch.data.recipe == "modern" and all(scratch.get(k) == v for k, v in MODERN_RECIPE.items())
    assert recipe_line(scratch).startswith("Recipe: modern (the default for training from scratch: packed")
    assert "--recipe classic for Google's BERT recipe" in recipe_line(scratch)
    release = tmp_path / "uncased_L-2_H-128_A-2"
    release.mkdir()
    for values in ({"init_checkpoint": str(release)}, {"model_family": "bert", "init_checkpoint": str(release)},
                   {"init_checkpoint": str(release), "model_family": "bert"}):
        continued = Config.from_dict(values)
        assert continued.data.recipe == "classic", values
        assert (continued.data.pack_sequences, continued.data.no_nsp, continued.data.masked_lm_prob,
                continued.train.lr_schedule, continued.model.hidden_dropout_prob) == (False, False, 0.15, "linear", -1)
        assert recipe_line(continued) == (
            f"Recipe: classic (the default when continuing init_checkpoint {release}, as it was trained: Google's "
            "BERT recipe, with next-sentence pairs); --recipe modern for packed MLM-only sequences, 30% masking, no "
            "dropout, AdamW beta2 0.98, warmup-stable-decay.")
    assert Config.load(init_checkpoint=str(release), recipe="modern").data.pack_sequences  # named: it wins
    assert Config.from_dict({"recipe": "modern", "init_checkpoint": str(release)}).data.recipe == "modern"
    modernbert = tmp_path / "modernbert"  # a transformers ModernBERT folder: ModernBERT's own recipe
    modernbert.mkdir()
    (modernbert / "config.json").write_text(json.dumps({"model_type": "modernbert"}))
    assert Config.load(init_checkpoint=str(modernbert)).data.recipe == "modern"
    assert recipe_line(Config.load(model_family="modernbert")).startswith("Recipe: modern (ModernBERT's: packed")
