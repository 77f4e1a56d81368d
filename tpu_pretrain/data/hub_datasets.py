"""A Hugging Face Hub dataset as corpus input: ``hf://datasets/OWNER/NAME[@REVISION][/CONFIG][?split=S&column=C]``.

The name is resolved to a commit first (so a dataset that changes while it is read, or a re-run next
month, reads the same files, and the manifest can say which), then the split's parquet files are
listed and each is checked from its footer; the rows are streamed by :mod:`.corpus_tables`. Both
layouts the Hub uses are understood: files in the repository (``data/train-00000-of-00001.parquet``,
``CONFIG/train-*.parquet``) and, for a dataset without parquet files, the Hub's own conversion
(revision ``refs/convert/parquet``, ``CONFIG/SPLIT/0000.parquet``). A private or gated dataset needs a
token: ``HF_TOKEN`` (a Kaggle secret of that name, or Colab's, which ``huggingface_hub`` reads itself);
it is passed to the Hub only, never printed or written.

``TPU_PRETRAIN_HUB_MIRROR`` names a local folder laid out as the Hub (``datasets/OWNER/NAME/...``, a
revision other than the default as ``NAME@REVISION``) that is read instead, through the same code: an
offline copy, and the tests.
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
import urllib.parse
from dataclasses import dataclass

from ..environment import environment_override
from ..errors import UserInputError
from ..runtime import COLAB, KAGGLE, runtime
from .corpus_tables import TableFile, check_table, split_options

HUB_PREFIX = "hf://datasets/"
CONVERTED = "refs/convert/parquet"  # the Hub's parquet conversion of every public dataset
DEFAULT_CONFIG = "default"
_SHOWN = 8
SPLIT_NAMES = ("train", "validation", "valid", "dev", "test", "eval")  # file-name prefixes that name a split


@dataclass(frozen=True)
class HubDataset:
    repo: str
    config: str = ""
    split: str = "train"
    column: str = ""
    revision: str = ""  # as given ("" for the default branch)


def is_hub_url(item: str) -> bool:
    return str(item).startswith("hf://")


def parse_hub_url(url: str) -> HubDataset:
    """The parts of ``hf://datasets/OWNER/NAME[@REVISION][/CONFIG][?split=S&column=C]``."""
    base, options = split_options(url)
    if "?" in base:
        raise UserInputError(f"--input {url}: after '?' give split=NAME and/or column=NAME, joined by '&'.")
    parts = base[len(HUB_PREFIX):].strip("/").split("/") if base.startswith(HUB_PREFIX) else []
    if not 2 <= len(parts) <= 3 or not all(parts):
        raise UserInputError(f"--input {url} is not a Hub dataset: write hf://datasets/OWNER/NAME, optionally "
                             "followed by /CONFIG and ?split=train&column=text (quote it in a shell).")
    name, _, revision = parts[1].partition("@")
    return HubDataset(f"{parts[0]}/{name}", parts[2] if len(parts) == 3 else "", options.get("split") or "train",
                      options.get("column", ""), revision)


def hub_token() -> str | None:
    """The HF_TOKEN secret of Colab or Kaggle, else the HF_TOKEN variable; None lets huggingface_hub look
    (``hf auth login``). Never printed or recorded."""
    try:
        if runtime() == COLAB:
            from google.colab import userdata  # type: ignore[import-not-found]

            return userdata.get("HF_TOKEN")
        if runtime() == KAGGLE:
            from kaggle_secrets import UserSecretsClient  # type: ignore[import-not-found]

            return UserSecretsClient().get_secret("HF_TOKEN")
    except Exception:  # no such secret, or access not granted to this notebook
        return None
    return environment_override("HF_TOKEN")


def hub_filesystem(token: str | None):
    """The Hub's filesystem, or the local mirror's when ``TPU_PRETRAIN_HUB_MIRROR`` names one."""
    mirror = environment_override("TPU_PRETRAIN_HUB_MIRROR")
    if mirror:
        from fsspec.implementations.dirfs import DirFileSystem
        from fsspec.implementations.local import LocalFileSystem

        return DirFileSystem(mirror, LocalFileSystem())
    from huggingface_hub import HfFileSystem

    return HfFileSystem(token=token)


def resolve_commit(dataset: HubDataset, revision: str, token: str | None) -> str | None:
    """The commit ``revision`` of the dataset points at now (None in a mirror, which has no commits)."""
    if environment_override("TPU_PRETRAIN_HUB_MIRROR"):
        return None
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        with reaching_the_hub(dataset):
            return HfApi(token=token).dataset_info(dataset.repo, revision=revision or None).sha
    except GatedRepoError:
        raise UserInputError(f"Dataset {dataset.repo} is gated: accept its terms on huggingface.co/datasets/"
                             f"{dataset.repo} and give a token of that account (HF_TOKEN).") from None
    except RevisionNotFoundError:
        raise UserInputError(f"Dataset {dataset.repo} has no revision '{revision}'.") from None
    except RepositoryNotFoundError:
        raise UserInputError(
            f"Dataset {dataset.repo} is not on the Hub, or it is private and no token with access was given: check "
            "the name, or set HF_TOKEN (Colab, Kaggle: a secret named HF_TOKEN).") from None


def _unreachable_errors() -> tuple[type[BaseException], ...]:
    """What the Hub's client raises when the Hub cannot be reached: its HTTP errors, OS errors, and the transport
    errors of the HTTP library it uses (httpx, or httpx2 in newer releases: neither is an OSError)."""
    from huggingface_hub.errors import HfHubHTTPError

    found: list[type[BaseException]] = [HfHubHTTPError, OSError]
    for name in ("httpx", "httpx2"):
        if importlib.util.find_spec(name) is not None:
            found.append(importlib.import_module(name).TransportError)
    return tuple(found)


@contextlib.contextmanager
def reaching_the_hub(dataset: HubDataset):
    """The Hub out of reach (no network, a proxy, an outage) is a message naming the dataset, never a traceback."""
    try:
        yield
    except _unreachable_errors() as exc:
        if isinstance(exc, FileNotFoundError) or getattr(getattr(exc, "response", None), "status_code", 0) in (
                401, 403, 404):  # answered: a missing file, or refused; said where it is asked
            raise
        raise UserInputError(f"The Hub could not be reached for dataset {dataset.repo} ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else 'no answer'}): check the connection (and "
                             "HF_ENDPOINT, a proxy), then run the same command again.") from None


def dataset_tables(url: str) -> list[TableFile]:
    """The checked parquet files of the split ``url`` names, in name order, pinned to one commit."""
    dataset = parse_hub_url(url)
    token = hub_token()
    fs = hub_filesystem(token)
    revision = dataset.revision
    with reaching_the_hub(dataset):
        chosen, config, root, commit = _split_files(fs, dataset, revision, token)
        if not chosen and not revision:  # no parquet in the repository: the Hub's conversion has them
            revision = CONVERTED
            chosen, config, root, commit = _split_files(fs, dataset, revision, token)
    if not chosen:
        raise UserInputError(f"Dataset {dataset.repo} has no parquet files (nor a parquet conversion on the Hub): "
                             "it cannot be streamed; download it and give its text files.")
    record = {"dataset": dataset.repo, "config": config, "split": dataset.split, "revision": commit or revision or None}
    with reaching_the_hub(dataset):
        tables = [check_table(TableFile(f"{root}/{rel}", dataset.column, fs, dict(record))) for rel in chosen]
    if not sum(t.rows for t in tables):
        raise UserInputError(f"Dataset {dataset.repo}, split '{dataset.split}' is empty: its file(s) "
                             f"{', '.join(t.name for t in tables[:_SHOWN])} hold no rows.")
    return tables


def _split_files(fs, dataset: HubDataset, revision: str, token: str | None):
    """``(parquet files of the split, config, filesystem root, commit)`` at ``revision``; no files: ``[]``."""
    commit = resolve_commit(dataset, revision, token)
    pin = commit or revision
    root = f"datasets/{dataset.repo}" + (f"@{urllib.parse.quote(pin, safe='')}" if pin else "")
    if commit is None and not fs.isdir(root):
        if revision == CONVERTED:
            return [], "", root, None
        raise UserInputError(f"Dataset {dataset.repo} (revision {revision or 'default'}) is not in the mirror "
                             f"TPU_PRETRAIN_HUB_MIRROR: no folder {root} there.")
    files = sorted(p[len(root) + 1:] for p in fs.find(root))
    configs = _card_configs(fs, root) if revision != CONVERTED else []
    if configs:
        chosen, config = _by_card(dataset, files, configs)
    else:
        chosen, config = _by_layout(dataset, [f for f in files if f.endswith(".parquet")])
    return [f for f in chosen if f.endswith(".parquet")], config, root, commit


def _card_configs(fs, root: str) -> list[dict]:
    """The ``configs`` a dataset card (README.md's YAML header) declares: names, splits and their files."""
    import yaml

    try:
        text = fs.cat_file(f"{root}/README.md").decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    if not text.startswith("---"):
        return []
    try:
        header = yaml.safe_load(text.split("---", 2)[1]) or {}
    except yaml.YAMLError:
        return []
    configs = header.get("configs") if isinstance(header, dict) else None
    return [c for c in configs if isinstance(c, dict) and c.get("config_name")] if isinstance(configs, list) else []


def _by_card(dataset: HubDataset, files: list[str], configs: list[dict]) -> tuple[list[str], str]:
    """The files of the config and split the dataset card names (glob patterns, as ``datasets`` reads them)."""
    names = [c["config_name"] for c in configs]
    default = [c for c in configs if c.get("default")] or [c for c in configs if c["config_name"] == DEFAULT_CONFIG]
    if dataset.config:
        found = [c for c in configs if c["config_name"] == dataset.config]
        if not found:
            raise UserInputError(f"Dataset {dataset.repo} has no config '{dataset.config}' (configs: {_some(names)}).")
    else:
        found = default or (configs if len(configs) == 1 else [])
        if not found:
            raise UserInputError(f"Dataset {dataset.repo} has several configs: name one as hf://datasets/"
                                 f"{dataset.repo}/CONFIG (configs: {_some(names)}).")
    config = found[0]
    splits = _card_splits(config.get("data_files"))
    if dataset.split not in splits:
        raise UserInputError(f"Dataset {dataset.repo} has no split '{dataset.split}' in config "
                             f"'{config['config_name']}' (splits there: {_some(sorted(splits))}): choose one with "
                             "?split=NAME.")
    patterns = [_glob_regex(p) for p in splits[dataset.split]]
    return [f for f in files if any(p.fullmatch(f) for p in patterns)], config["config_name"]


def _card_splits(data_files) -> dict[str, list[str]]:
    """A config's ``data_files`` (a pattern, a list of them, or splits with theirs) as split -> patterns."""
    if isinstance(data_files, str):
        return {"train": [data_files]}
    if isinstance(data_files, dict):
        return {str(k): [v] if isinstance(v, str) else list(v) for k, v in data_files.items()}
    splits: dict[str, list[str]] = {}
    for entry in data_files or []:
        if isinstance(entry, str):
            splits.setdefault("train", []).append(entry)
        elif isinstance(entry, dict) and "path" in entry:
            path = entry["path"]
            splits.setdefault(str(entry.get("split", "train")), []).extend([path] if isinstance(path, str) else path)
    return splits


def _glob_regex(pattern: str) -> re.Pattern:
    """A data_files glob as a regex: ``**`` crosses folders, ``*`` and ``?`` do not."""
    parts = re.split(r"(\*\*/?|\*|\?)", pattern.lstrip("./"))
    tokens = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
    return re.compile("".join(tokens.get(part, re.escape(part)) for part in parts))


def _split_of(rel: str, named: bool) -> str:
    """The split a file belongs to: ``train-00000-of-00001.parquet`` -> train, ``train/0000.parquet`` -> train;
    every file is ``train`` when no file is named after a split."""
    parts = rel.split("/")
    stem = parts[-1][: -len(".parquet")]
    if stem.isdigit() and len(parts) > 1:  # the Hub's conversion: CONFIG/SPLIT/0000.parquet
        return parts[-2].removeprefix("partial-")
    return re.split(r"[-_.]", stem)[0] if named else "train"


def _config_of(rel: str) -> str:
    """The config a file belongs to: its folders, less ``data`` and the split's own folder ("" for none)."""
    folders = rel.split("/")[:-1]
    if folders and rel.split("/")[-1][:-8].isdigit():
        folders = folders[:-1]
    return "/".join(f for f in folders if f != "data")


def _by_layout(dataset: HubDataset, files: list[str]) -> tuple[list[str], str]:
    """Without a dataset card: the files of the config (folder) and split (file name prefix) named."""
    if not files:
        return [], ""
    configs = sorted({_config_of(f) or DEFAULT_CONFIG for f in files})
    if not dataset.config and len(configs) > 1:
        raise UserInputError(f"Dataset {dataset.repo} has several configs: name one as hf://datasets/{dataset.repo}/"
                             f"CONFIG (configs: {_some(configs)}).")
    wanted = dataset.config or configs[0]
    in_config = [f for f in files if (_config_of(f) or DEFAULT_CONFIG) == wanted]
    if not in_config:
        raise UserInputError(f"Dataset {dataset.repo} has no config '{dataset.config}' (configs: {_some(configs)}).")
    named = any(_split_of(f, True) in SPLIT_NAMES for f in in_config)
    chosen = [f for f in in_config if _split_of(f, named) == dataset.split]
    if not chosen:
        splits = sorted({_split_of(f, named) for f in in_config})
        raise UserInputError(f"Dataset {dataset.repo} has no split '{dataset.split}' in config '{wanted}' (an empty "
                             f"split; splits there: {_some(splits)}): choose one with ?split=NAME.")
    return chosen, wanted


def _some(names: list[str]) -> str:
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return ", ".join(names[:_SHOWN]) + more
