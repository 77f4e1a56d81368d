"""What every export writes the same way: the destination checked (only a new or empty folder, or an earlier
export's, is ever replaced), the folder written beside it and swapped in, and the tokenizer files of a WordPiece
vocab (BERT's and a ModernBERT run's alike) or a run's tokenizer.json that ``transformers.AutoTokenizer`` loads."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ..data.tokenization import load_tokenizer
from ..data.vocab import Vocab
from ..errors import UserInputError
from ..storage.local import new_temp_folder

SPECIALS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
            "mask_token": "[MASK]"}


def write_tokenizer_files(folder: Path, vocab_file: str, do_lower_case: bool, model_max_length: int,
                          model_input_names: list[str] | None = None) -> None:
    """vocab.txt, tokenizer.json (fast), tokenizer_config.json and special_tokens_map.json, for AutoTokenizer.
    ``model_input_names``: what the tokenizer returns, where not BERT's (ModernBERT has no token types)."""
    shutil.copyfile(vocab_file, folder / "vocab.txt")
    tokenizer = load_tokenizer(vocab_file, do_lower_case)
    backend = tokenizer.backend
    backend.add_special_tokens(list(SPECIALS.values()))  # "[MASK]" typed in text stays one token
    backend.post_processor = _cls_sep_around(tokenizer.cls_id, tokenizer.sep_id)
    backend.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "BertTokenizer", "do_lower_case": do_lower_case, "strip_accents": None,
              "tokenize_chinese_chars": True, "do_basic_tokenize": True, "model_max_length": model_max_length,
              "clean_up_tokenization_spaces": False, **SPECIALS}
    if model_input_names:
        config["model_input_names"] = model_input_names
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "special_tokens_map.json").write_text(json.dumps(SPECIALS, indent=2) + "\n")


def _cls_sep_around(cls_id: int, sep_id: int):
    """A post-processor that puts [CLS] A [SEP] (B [SEP]) around encoded text, as BERT's and ModernBERT's do."""
    from tokenizers import processors

    return processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                         special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])


def write_tokenizer_json_files(folder: Path, tokenizer_file: str, model_max_length: int) -> None:
    """A run's tokenizer.json as it is (a released ModernBERT's, say), with a ``tokenizer_config.json`` as
    transformers' ModernBERT folders have it (``PreTrainedTokenizerFast``, BERT's special tokens by name): the
    file's own post-processor adds [CLS] and [SEP]; one is added where the file has none."""
    from tokenizers import Tokenizer

    source = Vocab.read(tokenizer_file).source
    spec = json.loads(source.read_text(encoding="utf-8"))
    if spec.get("post_processor"):
        shutil.copyfile(source, folder / "tokenizer.json")
    else:
        backend = Tokenizer.from_file(str(source))
        ids = backend.get_vocab(with_added_tokens=True)
        backend.post_processor = _cls_sep_around(ids["[CLS]"], ids["[SEP]"])
        backend.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length,
              "clean_up_tokenization_spaces": True, "model_input_names": ["input_ids", "attention_mask"], **SPECIALS}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "special_tokens_map.json").write_text(json.dumps(SPECIALS, indent=2) + "\n")


EXPORT_RECORD = ".tpu_pretrain_export.json"  # the files an export wrote: only those may be replaced


def check_export_destination(output_dir: str | os.PathLike) -> Path:
    """Refuse a destination that is a file, remote, or a folder holding anything but an earlier export's files."""
    out = Path(output_dir)
    if "://" in str(output_dir):
        raise UserInputError(f"{output_dir}: export to a local folder, then `tpu-pretrain upload` it.")
    if out.exists() and not out.is_dir():
        raise UserInputError(f"--output {out} is a file; an export is a folder. Choose a new or empty folder.")
    if not out.is_dir():
        return out
    present = {p.relative_to(out).as_posix() for p in out.rglob("*") if not p.is_dir()}
    try:
        written = set(json.loads((out / EXPORT_RECORD).read_text())["files"]) | {EXPORT_RECORD}
    except (OSError, ValueError, KeyError, TypeError):
        written = set()
    foreign = sorted(present - written)
    if present and foreign:
        kind = "files this tool did not write" if written else "files, and is not an earlier export of tpu-pretrain"
        raise UserInputError(
            f"--output {out} holds {kind} ({', '.join(foreign[:4])}{', ...' if len(foreign) > 4 else ''}). "
            "Nothing was written or deleted: choose a new or empty folder, or move those files away.")
    return out


def write_export_folder(output_dir: str | os.PathLike, write, format: str) -> Path:
    """Write into a sibling temporary folder, then swap it in: a reader never sees half an export, and only an
    earlier export (every file listed in its record) is ever replaced."""
    out = check_export_destination(output_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = new_temp_folder(out)  # a killed export's leftovers go first
    try:
        write(tmp)
        files = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
        (tmp / EXPORT_RECORD).write_text(json.dumps({"format": format, "files": files}, indent=2) + "\n")
        if out.exists():
            old = new_temp_folder(out)
            os.replace(out, old)  # onto an empty folder of our own
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
