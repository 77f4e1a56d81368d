"""Where this release of the package comes from: its version, repository and install source.

Stated once, here. The notebooks' install line and the "Open in Colab/Kaggle" badges (in the notebooks and
in README.md) are generated from these values by ``scripts/sync_release.py``, and a test checks that they
agree, so publishing the project (a fork, a new release) changes this file and nothing by hand.
"""

from __future__ import annotations

VERSION = "0.1.0"
REPOSITORY = "tpu-pretrain/tpu_pretrain"  # github.com/<owner>/<name>
RELEASE = f"v{VERSION}"  # the git tag the notebooks install from


def install_source() -> str:
    """What ``pip install`` takes to install this release (a pinned tag of the public repository)."""
    return f"tpu_pretrain @ git+https://github.com/{REPOSITORY}@{RELEASE}"


def notebook_url(notebook: str) -> str:
    return f"https://github.com/{REPOSITORY}/blob/{RELEASE}/notebooks/{notebook}"


def badges(notebook: str) -> str:
    """Markdown "Open in Colab" and "Open in Kaggle" badges for a notebook of this release."""
    colab = f"https://colab.research.google.com/github/{REPOSITORY}/blob/{RELEASE}/notebooks/{notebook}"
    kaggle = f"https://kaggle.com/kernels/welcome?src={notebook_url(notebook)}"
    return (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab}) "
            f"[![Open In Kaggle](https://kaggle.com/static/images/open-in-kaggle.svg)]({kaggle})")
