"""``dyntc discover | suggest``: what the label set of a saved classifier does not cover, and what in it
should be merged or split.

``discover`` clusters a file of texts (one per line, or a CSV/JSONL column) into the existing labels
and proposed new ones; ``--accept all`` or ``--accept 1,3`` adds proposed clusters as labels in one
new version of the model. ``suggest`` lists merge and split suggestions with their evidence. Both are
human-readable by default and print one JSON object with ``--json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from dyntc.errors import DyntcError

ModelDir = Annotated[str, typer.Argument(help="Model directory written by `dyntc fit`, or a "
                                              "postgresql://[user@]host[:port]/db?model=NAME URL")]


def _texts(path: Path, text_col: str) -> list[str]:
    """The file's texts, each distinct text once (a log repeats texts; discover takes each once)."""
    from dyntc.cli.reading import read_examples

    texts = read_examples(path, text_col)
    distinct = list(dict.fromkeys(texts))
    if len(distinct) < len(texts):
        print(f"{len(texts) - len(distinct)} repeated texts of {path} taken once", file=sys.stderr)
    return distinct


def _picks(value: str | None, n_clusters: int) -> list[int] | None:
    """``--accept``: ``all`` or 1-based cluster numbers ``1,3`` -> 0-based positions (None = all)."""
    if value is None or value.strip().lower() == "all":
        return None
    try:
        numbers = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise DyntcError(f"--accept takes 'all' or cluster numbers such as 1,3; got {value!r}") from None
    bad = [n for n in numbers if not 1 <= n <= n_clusters]
    if not numbers or bad:
        raise DyntcError(f"--accept {value!r}: cluster numbers run from 1 to {n_clusters}")
    return [n - 1 for n in numbers]


def _print_discovery(found, shown: int, accepted: list[str] | None) -> None:
    c = found.counts()
    how = "estimated" if found.estimated else "given"
    print(f"{len(found.texts)} texts: {c['known']} in existing labels, {c['new']} in {len(found.clusters)} new "
          f"clusters, {c['noise']} noise (n_new {found.n_new} {how}; {found.seconds:.1f} s)")
    for i, cl in enumerate(found.clusters, 1):
        near = f"nearest label {cl.nearest_label!r} at {cl.nearest_distance:.3f}" if cl.nearest_label else ""
        print(f"\n[{i}] {cl.name}  ({cl.size} texts, cohesion {cl.cohesion:.2f}; {near})")
        for t in cl.central_texts[:shown]:
            print(f"    - {t}")
    if accepted is not None:
        print(f"\naccepted as labels: {', '.join(accepted) or '(none)'}")
    elif found.clusters:
        print("\nadd them with: dyntc discover MODEL --data FILE --accept all (or --accept 1,3)")


def discover(
    model: ModelDir,
    data: Annotated[Path, typer.Option(help="Texts: .txt one per line, or .csv/.tsv/.jsonl with --text-col")],
    n_new: Annotated[Optional[int], typer.Option(help="Number of new clusters (default: estimated)")] = None,
    max_new: Annotated[Optional[int], typer.Option(help="Most new clusters the estimate considers")] = None,
    min_cluster_size: Annotated[int, typer.Option(help="Smaller new clusters are noise")] = 3,
    mode: Annotated[str, typer.Option(help="default | fast")] = "default",
    adapt_s: Annotated[Optional[float], typer.Option(
        help="First fine-tune a copy of the backbone's top layers on the texts for this many seconds (minutes "
             "on a CPU; better clusters on thousands of texts)")] = None,
    words_weight: Annotated[Optional[float], typer.Option(
        help="Weight of the texts' own words beside the encoder's points (default: the library's; "
             "0: the encoder alone)")] = None,
    text_col: Annotated[str, typer.Option(help="Text column of a CSV/JSONL file")] = "text",
    accept: Annotated[Optional[str], typer.Option(help="Add clusters as labels, one new version: all | 1,3")] = None,
    add_examples: Annotated[bool, typer.Option(help="With --accept: texts placed in existing labels join them")] = False,
    examples: Annotated[int, typer.Option(help="Central texts shown per cluster")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
) -> None:
    """Group texts into the existing labels and proposed new ones (and with --accept, add them)."""
    from dyntc.classifier import DynamicClassifier

    texts = _texts(data, text_col)
    options = {"max_new": max_new, "min_cluster_size": min_cluster_size, "mode": mode, "adapt_s": adapt_s,
               **({} if words_weight is None else {"words_weight": words_weight})}
    accepted = None
    # adapt_s trains for minutes: outside the store's write lock (a discovery made stale meanwhile is refused)
    found = DynamicClassifier.load(model).discover(texts, n_new, **options) if accept is None or adapt_s else None
    if accept is not None:
        with DynamicClassifier.edit(model, op="discover") as clf:
            if found is None:
                found = clf.discover(texts, n_new, **options)
            picks = _picks(accept, len(found.clusters))
            clf.accept(found, picks, add_examples=add_examples)
        accepted = [c.name for c in (found.clusters if picks is None else [found.clusters[i] for i in picks])]
    if as_json:
        print(json.dumps({**found.to_dict(), "accepted": accepted}, ensure_ascii=False))
    else:
        _print_discovery(found, examples, accepted)


def suggest(
    model: ModelDir,
    top: Annotated[Optional[int], typer.Option(help="At most this many suggestions")] = None,
    merge_rate: Annotated[Optional[float], typer.Option(help="Confusion rate from which a merge is suggested")] = None,
    split_ratio: Annotated[Optional[float], typer.Option(help="Part distance / nearest-label distance from which "
                                                                   "a split is suggested")] = None,
    examples: Annotated[int, typer.Option(help="Example texts shown per suggestion")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
) -> None:
    """Suggest labels to merge (confused) and to split (two groups), with their evidence."""
    from dyntc.classifier import DynamicClassifier

    options = {k: v for k, v in (("top", top), ("merge_rate", merge_rate), ("split_ratio", split_ratio)) if v is not None}
    found = DynamicClassifier.load(model).suggest(**options)
    if as_json:
        print(json.dumps({"suggestions": [s.to_dict(texts_per_part=examples) for s in found]}, ensure_ascii=False))
        return
    if not found:
        print("no suggestion: no two labels are confused and no label holds two separate groups")
        return
    for i, s in enumerate(found, 1):
        print(f"[{i}] {s.describe()}")
        if s.kind == "merge":
            for key in ("examples_a_nearer_b", "examples_b_nearer_a"):
                for t in s.evidence[key][:examples]:
                    print(f"    - {t}")
        else:
            for part, texts in s.parts.items():
                print(f"    {part}: " + " | ".join(texts[:examples]))
