"""Write the release's install source and badges (tpu_pretrain/release.py) into the notebooks and README.md.

Run after changing the release (a fork, a new tag): ``python scripts/sync_release.py``. The notebooks keep
everything else as it is; tests/test_notebooks.py checks they agree with the release.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tpu_pretrain.release import badges, install_source  # noqa: E402

BADGE_LINE = re.compile(r"\[!\[Open In Colab\].*?\)\]\(.*?\) \[!\[Open In Kaggle\].*?\)\]\(.*?\)")
INSTALL = re.compile(r'"tpu_pretrain @ [^"]*"')


def sync_notebook(path: Path) -> bool:
    notebook = json.loads(path.read_text())
    before = json.dumps(notebook)
    for cell in notebook["cells"]:
        text = "".join(cell["source"])
        text = BADGE_LINE.sub(lambda _: badges(path.name), text)
        text = INSTALL.sub(json.dumps(install_source()), text)
        cell["source"] = text.splitlines(keepends=True)
    if json.dumps(notebook) == before:
        return False
    path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")
    return True


def sync_readme(path: Path) -> bool:
    text = path.read_text()
    new = re.sub(r"(\| `(\d\d_\w+)` \|.*?\| )" + BADGE_LINE.pattern,
                 lambda m: m.group(1) + badges(m.group(2) + ".ipynb"), text)
    if new != text:
        path.write_text(new)
    return new != text


if __name__ == "__main__":
    changed = [p.name for p in sorted((REPO / "notebooks").glob("*.ipynb")) if sync_notebook(p)]
    if sync_readme(REPO / "README.md"):
        changed.append("README.md")
    print("updated: " + (", ".join(changed) if changed else "nothing (already in sync)"))
