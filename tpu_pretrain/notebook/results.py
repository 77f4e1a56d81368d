"""A trained model in a person's hands: fill-mask through ``transformers``, a zip to download, the Hub.

The Hugging Face export is what people will use, so the notebook checks it the way they will load it:
``transformers``' own fill-mask pipeline on the exported folder.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..data.hub_datasets import hub_token
from ..errors import UserInputError
from ..runtime import COLAB, KAGGLE, runtime


def fill_mask_with_transformers(hf_dir: str | os.PathLike, sentences: list[str], top_k: int = 5) -> str:
    """The ``transformers`` fill-mask pipeline on an exported folder: each sentence's top-k words per [MASK]."""
    from transformers import pipeline

    fill = pipeline("fill-mask", model=str(hf_dir), tokenizer=str(hf_dir), top_k=top_k)
    lines = []
    for sentence in sentences:
        results = fill(sentence)
        slots = results if sentence.count("[MASK]") > 1 else [results]
        lines.append(sentence)
        for n, slot in enumerate(slots, 1):
            lines.append(f"  [MASK] {n}: " + ", ".join(f"{r['token_str']} ({r['score']:.3f})" for r in slot))
    return "\n".join(lines)


def zip_folder(folder: str | os.PathLike, destination: str | os.PathLike) -> Path:
    """``destination.zip`` holding ``folder`` (written whole before it appears under its name)."""
    destination = Path(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    partial = shutil.make_archive(str(destination.with_name(destination.name + ".partial")), "zip", str(folder))
    final = destination.with_suffix(".zip")
    os.replace(partial, final)
    return final


def offer_download(path: str | os.PathLike) -> str:
    """Start the browser download on Colab; say where the file is elsewhere."""
    if runtime() == COLAB:
        from google.colab import files  # type: ignore[import-not-found]

        files.download(str(path))
        return f"Downloading {path} (your browser asks where to save it)."
    if runtime() == KAGGLE:
        return f"{path} is in this notebook's output: download it from the Output tab once the version is saved."
    return f"The export is at {Path(path).resolve()}."


def push_to_hub(folder: str | os.PathLike, repo_id: str, token: str | None = None, private: bool = True) -> str:
    """Upload an export to the Hugging Face Hub (a private model repository unless asked otherwise)."""
    try:
        from huggingface_hub import HfApi
    except ImportError:
        raise UserInputError("Pushing to the Hub needs huggingface_hub: pip install huggingface_hub") from None
    token = token or hub_token()
    if not token:
        raise UserInputError("No Hugging Face token: add one as a secret named HF_TOKEN (Colab: the key icon; "
                             "Kaggle: Add-ons > Secrets) with write access, or set the HF_TOKEN variable.")
    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model",
                      commit_message="Upload a BERT pretrained with tpu_pretrain")
    return f"Pushed {folder} to https://huggingface.co/{repo_id} ({'private' if private else 'public'})."
