"""The documentation's code runs and its links resolve.

Every ```python block of README.md and of docs/classifier.md is executed, each file's blocks in order
as one script (a later block may use names an earlier one defined), so that documented code cannot
rot. The blocks are self-contained: they use the default classifier (the packaged all-MiniLM-L6-v2,
offline) on a handful of inline texts, no dataset files.

Every relative link in README.md, CHANGELOG.md and docs/*.md must name an existing file, and a
``#fragment`` must name a heading of the target markdown file (GitHub's anchor rules).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNNABLE = ["README.md", "docs/classifier.md"]
LINKED = ["README.md", "CHANGELOG.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def python_blocks(text: str) -> list[str]:
    return FENCE.findall(text)


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, -1, -2 for repeats."""
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
            continue
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if in_code or not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(2).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("name", RUNNABLE)
def test_python_blocks_run(name, tmp_path, monkeypatch):
    blocks = python_blocks((ROOT / name).read_text(encoding="utf-8"))
    assert blocks, f"{name} has no python block"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__doc__"}
    for i, block in enumerate(blocks, 1):
        try:
            exec(compile(block, f"{name}, python block {i}", "exec"), namespace)
        except Exception as exc:  # name the block in the failure
            raise AssertionError(f"{name}, python block {i} failed: {type(exc).__name__}: {exc}\n{block}") from exc


@pytest.mark.parametrize("name", LINKED)
def test_relative_links_resolve(name):
    source = ROOT / name
    text = re.sub(r"^```.*?^```", "", source.read_text(encoding="utf-8"), flags=re.S | re.M)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto: not checked here
        path, _, fragment = target.partition("#")
        file = (source.parent / path).resolve() if path else source
        if not file.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and file.suffix == ".md" and fragment not in anchors(file.read_text(encoding="utf-8")):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{name}: broken links: {broken}"
