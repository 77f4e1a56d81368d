"""The command line as a new user meets it: help pages, mistyped flags, negative values, values that make no
sense, a setting in the wrong section of a YAML file; each answered with a message, never a traceback."""

import subprocess
import sys
from pathlib import Path

import pytest

from tpu_pretrain.cli import EXIT_CODES, build_parser
from tpu_pretrain.config import Config, ConfigError


def cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "tpu_pretrain", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_every_help_page_renders():
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    for command in ["", *commands]:
        done = cli(*([command] if command else []), "--help")
        assert done.returncode == 0 and "Traceback" not in done.stderr, (command, done.stderr[-2000:])
        assert "exit codes: 0 done" in " ".join(done.stdout.split()), command
    assert "(e.g. '%')" in " ".join(cli("vocab", "--help").stdout.split())  # the % that used to crash argparse


@pytest.mark.parametrize("args, says", [
    (["train", "--learnig_rate", "1e-4"], "arguments: --learnig_rate 1e-4 (did you mean --learning_rate?)"),
    (["create-data", "--dupe_factr", "2"], "(did you mean --dupe_factor?)"),
    (["vocab", "--vocab_file", "v.txt"], "(vocab_file is a setting of create-data, train, not of vocab)"),
    (["train", "--learning_rate", "-1e-4"], "Setting learning_rate=-0.0001 is invalid: use a positive value"),
    (["train", "--adam_beta1", "5"], "Setting adam_beta1=5.0 is invalid: use a value in [0, 1)"),
    (["train", "--adam_epsilon", "-1"], "Setting adam_epsilon=-1.0 is invalid"),
    (["train", "--rewarm_steps", "-3"], "Setting rewarm_steps=-3 is invalid: use 0 (no new warmup)"),  # unused
    (["create-data", "--random_seed", "-1"], "Setting random_seed=-1 is invalid: use 0 or more"),
    (["train", "--learning_rate", "inf"], "'learning_rate' in configuration has value inf, which is not a valid "
                                          "float (not a finite number)"),
    (["train", "--mirror_dir", "s3://bucket/run"], "'s3:' is not a supported location"),
    (["train", "--process_index", "1"], "process_index=1 is invalid: give --coordinator_address HOST:PORT and "
                                        "--num_processes N (2 or more) with --process_index I"),
], ids=lambda value: " ".join(value) if isinstance(value, list) else "")
def test_mistakes_get_a_message_that_points_the_right_way(args, says):
    done = cli(*args)
    assert done.returncode == 2, done.stderr
    assert says in " ".join(done.stderr.split()), done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("args, first_line", [
    (["train", "--learnig_rate", "1e-4"], "tpu-pretrain train: error: unrecognized arguments: --learnig_rate 1e-4 "
                                          "(did you mean --learning_rate?)"),
    (["trian"], "tpu-pretrain: error: argument COMMAND: invalid choice: 'trian' (choose from "),
    (["train", "--backend", "jaz"], "tpu-pretrain train: error: argument --backend: invalid choice: 'jaz' (choose "),
], ids=["flag", "command", "choice"])
def test_the_error_comes_first_with_a_short_usage(args, first_line):
    done = cli(*args)
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and lines[0].startswith(first_line) and "(did you mean " in lines[0], done.stderr
    assert len(lines) == 2 and lines[1].startswith("usage: tpu-pretrain "), done.stderr  # not train's 60 lines


def test_a_setting_in_the_wrong_section_names_its_section(tmp_path):
    (tmp_path / "config.yaml").write_text("data:\n  vocab_size: 8000\n")
    with pytest.raises(ConfigError, match="'vocab_size' .* is under section 'data', but it belongs to section 'vocab'"):
        Config.load(tmp_path / "config.yaml")
    done = cli("vocab", "--config", str(tmp_path / "config.yaml"), "--input", str(tmp_path))
    assert done.returncode == 2 and "belongs to section 'vocab'" in done.stderr
    assert "Did you mean 'vocab_size'" not in done.stderr


def test_the_exit_codes_are_documented():
    assert all(f"{code} " in EXIT_CODES for code in (0, 1, 2, 75, 130))
    page = (Path(__file__).parents[1] / "docs" / "command-line.md").read_text()
    assert "| 75 | `train` stopped early" in page and "| 130 | interrupted" in page
