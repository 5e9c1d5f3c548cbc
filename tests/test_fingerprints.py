"""A content check by fingerprints (jobtypes/datafiles/fingerprint.py), on SQLite and PostgreSQL:
it reads only the files whose stat no longer reads as the fingerprint recorded when their bytes
were known, gives the verdicts of reading them all, trusts no racily clean fingerprint, reads
files that have none, and records one for each file it reads in sync."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import sqlalchemy as sa

from test_targets_table import drop_targets
from tether import Coordinator, CreateFile
from tether.jobtypes.datafiles import content as content_probe
from tether.jobtypes.datafiles import fingerprint
from tether.jobtypes.datafiles.durable import Known
from tether.ledger import meta
from tether.ledger.engine import create_engine
from tether.reconcile.check import reconcile


def written(coordinator: Coordinator, count: int) -> dict[str, str]:
    """``count`` files written by create_file jobs: job id by path."""
    ids = {
        f"d{n % 3}/{n:03d}.json": coordinator.enqueue(CreateFile(path=f"d{n % 3}/{n:03d}.json", content={"n": n})).id
        for n in range(count)
    }
    assert coordinator.run_until_idle() == count
    return ids


def fingerprints(coordinator: Coordinator) -> dict[str, str | None]:
    with coordinator.engine.connect() as conn:
        return {job_id: value for job_id, value in conn.execute(sa.text("SELECT id, fingerprint FROM tether_jobs"))}


def record(coordinator: Coordinator, job_id: str, value: str | None) -> None:
    with coordinator.engine.begin() as conn:
        conn.execute(sa.text("UPDATE tether_jobs SET fingerprint = :f WHERE id = :id"), {"f": value, "id": job_id})


def trusted(path: Path) -> str | None:
    """The fingerprint of the file at ``path`` as recorded a second after its write."""
    st = os.stat(path)
    return fingerprint.of(Known(st.st_ctime_ns + 1_000_000_000, st))


def edit_in_place(path: Path) -> None:
    """Other bytes of the same size, its mtime (and atime) set back as ``touch -r`` would."""
    st = os.stat(path)
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x01
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the data files a check opens to read."""
    names: list[str] = []
    real_open = content_probe.open_data_file

    def counting(dir_fd: int, name: str) -> int:
        names.append(name)
        return real_open(dir_fd, name)

    monkeypatch.setattr(content_probe, "open_data_file", counting)
    return names


def test_a_file_whose_stat_reads_as_a_trusted_fingerprint_is_not_read(
    coordinator: Coordinator, root: Path, opened: list[str]
) -> None:
    ids = written(coordinator, 12)
    for path, job_id in ids.items():  # as if each was recorded a second after its write
        record(coordinator, job_id, trusted(root / path))
    report = reconcile(coordinator)
    assert report.counts["in_sync"] == 12 and report.exit_code == 0
    assert opened == []
    assert reconcile(coordinator, full=True).counts["in_sync"] == 12
    assert len(opened) == 12, "--full reads every file"


def test_files_edited_in_place_with_their_mtime_restored_are_exactly_the_modified_ones(
    coordinator: Coordinator, root: Path, opened: list[str]
) -> None:
    """The 1 % case of benchmarks/reconcile.py, small: whatever the fingerprints recorded at
    completion (trusted, or racily clean and read), a first check and edits after it."""
    ids = written(coordinator, 200)
    assert all("fingerprint" in coordinator.get(i).result_data for i in ids.values()), "beside each hash"
    assert reconcile(coordinator).exit_code == 0
    edited = sorted(ids)[::100]
    for path in edited:
        edit_in_place(root / path)
    opened.clear()
    by_fingerprint, full = reconcile(coordinator), reconcile(coordinator, full=True)
    expected = {(path, "modified") for path in edited}
    assert {(f.path, f.status) for f in by_fingerprint.findings} == expected
    assert {(f.path, f.status) for f in full.findings} == expected
    assert by_fingerprint.counts == full.counts


def test_a_racily_clean_file_is_read_though_its_stat_reads_as_its_fingerprint(
    coordinator: Coordinator, root: Path, opened: list[str]
) -> None:
    """A write within the file system's timestamp tick of a stat leaves ctime as it was: made here
    by recording, after the write, the stat it left as if taken inside the tick of its ctime
    (what a fingerprint taken just before that write would hold on a coarse clock)."""
    ids = written(coordinator, 2)
    path, other = sorted(ids)
    edit_in_place(root / path)
    st, st_other = os.stat(root / path), os.stat(root / other)
    racy = fingerprint.of(Known(st.st_ctime_ns + fingerprint.grain_ns(st.st_ctime_ns) - 1, st))
    record(coordinator, ids[path], racy)
    record(
        coordinator,
        ids[other],
        fingerprint.of(Known(st_other.st_ctime_ns + fingerprint.grain_ns(st.st_ctime_ns), st_other)),
    )
    report = reconcile(coordinator)
    assert [(f.path, f.status) for f in report.findings] == [(path, "modified")]
    assert opened == [Path(path).name], "a fingerprint taken a full tick after its ctime is trusted"


def test_files_without_a_fingerprint_are_read_and_then_get_one(
    coordinator: Coordinator, root: Path, opened: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = written(coordinator, 6)
    for job_id in ids.values():  # as a ledger from before fingerprints holds them
        record(coordinator, job_id, None)
    edited = sorted(ids)[0]
    edit_in_place(root / edited)
    # A tick of zero: every file read in sync gets a fingerprint now (else only those whose
    # ctime is a tick old, which depends on how fast this test ran).
    monkeypatch.setattr(fingerprint, "TICK_NS", 0)
    report = reconcile(coordinator)
    assert [(f.path, f.status) for f in report.findings] == [(edited, "modified")]
    assert len(opened) == 6, "no fingerprint: each file read, as before fingerprints"
    now = fingerprints(coordinator)
    assert now[ids[edited]] is None, "a file read out of sync gets none"
    assert all(now[ids[p]] for p in ids if p != edited)
    opened.clear()
    assert [(f.path, f.status) for f in reconcile(coordinator).findings] == [(edited, "modified")]
    assert opened == [Path(edited).name], "the next check reads only the file still out of sync"


def test_a_missing_file_without_a_fingerprint_is_missing_not_in_sync(
    coordinator: Coordinator, root: Path, opened: list[str]
) -> None:
    """A stat that fails (here beside files whose stats succeed, in one directory) matches no
    fingerprint, not even none recorded: the file is read, and the read finds it missing."""
    ids = written(coordinator, 9)
    for path, job_id in ids.items():
        record(coordinator, job_id, trusted(root / path))
    gone, also_gone = sorted(ids)[0], sorted(ids)[4]
    record(coordinator, ids[gone], None)
    (root / gone).unlink()
    (root / also_gone).unlink()
    same, fresh = fingerprint.compare(root, [gone, also_gone, "d9/absent.json"], [None, "00", None])
    assert same == [False, False, False] and fresh == [None, None, None]
    report = reconcile(coordinator)
    assert sorted((f.path, f.status) for f in report.findings) == [(gone, "missing"), (also_gone, "missing")]
    assert sorted(opened) == sorted([Path(gone).name, Path(also_gone).name]), "only the two are read"


def test_an_accepted_file_keeps_a_fingerprint_of_what_was_accepted(
    coordinator: Coordinator, root: Path, opened: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    written(coordinator, 2)
    (root / "d0/000.json").write_text('{"by": "hand"}')
    monkeypatch.setattr(fingerprint, "TICK_NS", 0)  # trusted at once: see above
    (adopt,) = coordinator.accept(["d0/000.json"], by="ops")
    assert fingerprints(coordinator)[adopt.id] == fingerprint.stamp(os.stat(root / "d0/000.json"))
    opened.clear()
    assert reconcile(coordinator).exit_code == 0
    assert "000.json" not in opened
    edit_in_place(root / "d0/000.json")
    assert [(f.path, f.status) for f in reconcile(coordinator).findings] == [("d0/000.json", "modified")]


def test_a_ledger_of_schema_10_gets_the_fingerprint_column_and_its_jobs_are_read_as_before(
    db_url: str, root: Path
) -> None:
    with Coordinator.open(db_url, root=root) as c:
        old = c.enqueue(CreateFile(path="old.json", content=1)).id
        c.run_until_idle()
    engine = create_engine(db_url)
    with engine.begin() as conn:  # as schema 10 left it
        conn.exec_driver_sql(f"DELETE FROM tether_meta WHERE key = '{meta.LAYOUT}'")
        conn.exec_driver_sql(f"UPDATE tether_meta SET value = '10' WHERE key = '{meta.VERSION}'")
        drop_targets(conn)  # schema 13's, which read the column
        conn.exec_driver_sql("ALTER TABLE tether_jobs DROP COLUMN fingerprint")
    engine.dispose()

    with Coordinator.open(db_url, root=root) as c:
        assert fingerprints(c) == {old: None}
        new = c.enqueue(CreateFile(path="new.json", content=2)).id
        c.run_until_idle()
        assert "fingerprint" in c.get(new).result_data  # recorded, or None when racily clean
        assert reconcile(c).counts["in_sync"] == 2
        with c.engine.connect() as conn:
            assert meta.read(conn)[meta.VERSION] == str(meta.SCHEMA_VERSION)
