"""The walk for leftover temp files lists a leaf directory only when it changed since a listing
found it clean (reconcile/clean_dirs.py), on SQLite and PostgreSQL: a temp file made since is
found, a racily clean directory is listed again, a check that trusts no fingerprint lists every
directory, and the rows of directories gone are forgotten."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from tether import Coordinator, CreateFile
from tether.jobtypes.datafiles import fingerprint
from tether.reconcile.check import reconcile

TEMP = ".x.json.0123abcd.tether-tmp"


@pytest.fixture
def listed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per directory the walk lists by its names (a leaf's listing)."""
    lists: list[int] = []
    real = os.listdir

    def counting(path: int | str = ".") -> list[str]:
        lists.append(1)
        return real(path)

    monkeypatch.setattr(os, "listdir", counting)
    return lists


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk's clock read as a minute on: every directory's ctime lies ticks behind its fstat,
    as it does for directories not written in the last moments."""
    real = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real() + 60 * 1_000_000_000)


def written(coordinator: Coordinator) -> None:
    for n in range(6):
        coordinator.enqueue(CreateFile(path=f"d{n % 3}/{n}.json", content={"n": n}))
    assert coordinator.run_until_idle() == 6


def rows(coordinator: Coordinator) -> set[tuple[str, str]]:
    with coordinator.engine.connect() as conn:
        return {(p, n) for p, n in conn.execute(sa.text("SELECT parent, name FROM tether_clean_dirs"))}


def test_an_unchanged_leaf_is_not_listed_again_and_a_temp_file_made_in_it_since_is_found(
    coordinator: Coordinator, root: Path, listed: list[int], settled: None
) -> None:
    written(coordinator)
    assert not reconcile(coordinator).findings
    assert rows(coordinator) == {("", "d0"), ("", "d1"), ("", "d2")}
    listed.clear()
    assert not reconcile(coordinator).findings
    assert listed == [], "no leaf changed since the first check found each clean"
    (root / "d1" / TEMP).write_bytes(b"partial")
    report = reconcile(coordinator)
    assert [(f.path, f.status) for f in report.findings] == [(f"d1/{TEMP}", "leftover_temp")]
    assert len(listed) == 1, "only the changed directory is listed"
    assert ("", "d1") not in rows(coordinator), "a directory holding a temp file is not clean"
    assert [f.path for f in reconcile(coordinator).findings] == [f"d1/{TEMP}"]


def test_a_racily_clean_directory_is_not_recorded_and_is_listed_again(
    coordinator: Coordinator, listed: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every fstat within a tick of its directory's ctime: the tick made a minute long."""
    written(coordinator)
    monkeypatch.setattr(fingerprint, "TICK_NS", 60 * 1_000_000_000)
    monkeypatch.setattr(fingerprint, "COARSE_NS", 60 * 1_000_000_000)
    assert not reconcile(coordinator).findings
    assert rows(coordinator) == set()
    listed.clear()
    reconcile(coordinator)
    assert len(listed) == 3


def test_a_check_that_trusts_no_fingerprint_lists_every_directory(
    coordinator: Coordinator, listed: list[int], settled: None
) -> None:
    written(coordinator)
    reconcile(coordinator)
    listed.clear()
    assert not reconcile(coordinator, full=True).findings
    assert len(listed) == 3


def test_the_rows_of_directories_gone_are_forgotten_and_a_leaf_that_gains_a_subdirectory_is_walked(
    coordinator: Coordinator, root: Path, settled: None
) -> None:
    written(coordinator)
    reconcile(coordinator)
    for name in os.listdir(root / "d2"):
        os.unlink(root / "d2" / name)
    os.rmdir(root / "d2")
    (root / "d0" / "sub").mkdir()
    (root / "d0" / "sub" / TEMP).write_bytes(b"partial")
    report = reconcile(coordinator)
    assert {(f.path, f.status) for f in report.findings} == {
        ("d2/2.json", "missing"),
        ("d2/5.json", "missing"),
        (f"d0/sub/{TEMP}", "leftover_temp"),
    }
    assert rows(coordinator) == {("", "d1")}, "d2 is gone and d0 is no leaf: their rows are forgotten"
