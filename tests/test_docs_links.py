"""Every relative link and #anchor in README.md and docs/*.md leads somewhere: the file exists, the heading too.

README is a short guide and the reference lives in docs/: a page renamed or a heading reworded must not leave a
link behind that GitHub would show as working and that opens at the top of the wrong page or nowhere.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\]\(([^)\s]+)\)")  # the target of [text](target) and of ![alt](target)
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.M)


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation (backticks, colons, ...) dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings, a repeated one numbered as GitHub numbers it (-1, -2, ...)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        anchor = github_anchor(heading)
        if anchor in seen:
            seen[anchor] += 1
            anchor = f"{anchor}-{seen[anchor]}"
        else:
            seen[anchor] = 0
        found.add(anchor)
    return found


def broken_links(path: Path) -> list[str]:
    """The relative links of ``path`` whose file or heading does not exist, each as ``target: why``."""
    text = CODE_SPAN.sub("", FENCE.sub("", path.read_text()))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...: not this repository's
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no file {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with the anchor #{anchor} in {linked.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    assert not broken_links(page), f"{page.relative_to(REPO)}: {broken_links(page)}"


def test_readme_links_every_docs_page():
    readme = (REPO / "README.md").read_text()
    assert len(PAGES) > 5, "the reference pages are missing from docs/"
    unlinked = [p.name for p in PAGES[1:] if f"(docs/{p.name}" not in readme]
    assert not unlinked, f"README.md links no page of docs/ named {unlinked}"


def test_the_checker_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "other.md").write_text("# Will it fit? `tpu-pretrain plan`: compiled\n\n## Same\n\n## Same\n")
    page = tmp_path / "page.md"
    page.write_text("# Top\n[a](other.md#will-it-fit-tpu-pretrain-plan-compiled) [b](other.md#same-1) [c](#top)\n"
                    "[d](gone.md) [e](other.md#nowhere) [f](#nor-here) `[g](not-a-link.md)` [h](https://x.org/y)\n"
                    "```\n[i](inside-a-fence.md)\n```\n")
    found = broken_links(page)
    assert [entry.split(":")[0] for entry in found] == ["gone.md", "other.md#nowhere", "#nor-here"], found


def test_the_docs_say_where_jax_tpu_goes_for_plan_and_which_pins_the_images_hold():
    """Issue 44, item 7: a new user planning for a TPU from a laptop must learn where the TPU compiler goes (the
    environment that runs ``tpu-pretrain plan``) and which versions to match; the images' pins the page quotes are
    the ones the image-exact environments are built from (tests/environments), so a new pin there fails here."""
    page = " ".join((REPO / "docs" / "tpus.md").read_text(encoding="utf-8").split())
    assert "**Where `jax[tpu]` goes**: into the environment that runs `tpu-pretrain plan`" in page
    assert "pip install \"jax[tpu]==$(python -c 'import jax; print(jax.__version__)')\"" in page
    for pins in sorted((REPO / "tests" / "environments").glob("*_tpu.txt")):
        for pin in re.findall(r"^(jax\[tpu\]==[\w.]+|libtpu==[\w.]+)$", pins.read_text(encoding="utf-8"), re.M):
            assert f"`{pin}`" in page, (pins.name, pin)
    commands = " ".join((REPO / "docs" / "command-line.md").read_text(encoding="utf-8").split())
    assert "the TPU compiler (jax[tpu]) goes into the environment whose tpu-pretrain runs the plan" in commands


def test_the_walk_through_names_the_environment_make_demo_leaves_and_a_cpu_torch():
    """Issue 44, item 5: README's walk-through runs in one environment, the one ``make demo`` creates (the Makefile's
    DEMO_VENV), and installs PyTorch's CPU-only build where no GPU is present, not 5.5 GB of CUDA wheels."""
    venv = re.search(r"^DEMO_VENV := (\S+)$", (REPO / "Makefile").read_text(encoding="utf-8"), re.M)[1]
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    walk = readme[readme.index("## Your own text on a CPU"):readme.index("## The notebooks on Colab and Kaggle")]
    assert f"source {venv}/bin/activate" in walk
    assert set(re.findall(r"(\.venv[\w-]*)", walk)) == {venv}, re.findall(r"(\.venv[\w-]*)", walk)
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in walk
    assert "pip install transformers torch" not in walk and "`train` uses JAX" in walk
