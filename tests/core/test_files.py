"""Atomic writes (dyntc.core.files): the target is the old file or the new one, never a half-written one."""

import json

import pytest

from dyntc.core.files import atomic_write, write_json, write_text


def test_atomic_write_replaces_the_target_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "sub" / "out.txt"  # parent folders are created
    write_text(target, "old")
    with atomic_write(target) as tmp:
        assert tmp.parent == target.parent and tmp != target
        tmp.write_text("new")
        assert target.read_text() == "old"  # not replaced before the block ends
    assert target.read_text() == "new"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.txt"]


def test_an_error_in_the_block_keeps_the_old_file(tmp_path):
    target = tmp_path / "out.txt"
    write_text(target, "old")
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_write(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("disk full")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_a_block_that_writes_nothing_leaves_the_target_alone(tmp_path):
    target = tmp_path / "plot.png"
    with atomic_write(target):
        pass
    assert not target.exists()
    write_text(target, "kept")
    with atomic_write(target):
        pass
    assert target.read_text() == "kept"


def test_write_json_keeps_non_ascii_labels_readable(tmp_path):
    write_json(tmp_path / "x.json", {"label": "Überweisung"})
    text = (tmp_path / "x.json").read_text(encoding="utf-8")
    assert "Überweisung" in text and json.loads(text) == {"label": "Überweisung"}
