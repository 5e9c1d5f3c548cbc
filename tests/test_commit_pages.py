"""The pages a SQLite commit writes: a claim and a completion on a target leave the index of each
target's jobs (ix_tether_jobs_on_target) alone, so a hot target's commit writes no page of it
(benchmarks/wal_frames.py counts them all)."""

from __future__ import annotations

import sqlite3
import struct
from pathlib import Path

from tether import Coordinator, CreateFile
from tether.jobtypes import default_registry

FRAME_HEADER = 24


def pages_in_wal(db: Path) -> set[int]:
    """The page numbers of the frames in ``db``'s WAL."""
    wal = Path(f"{db}-wal").read_bytes()
    size = FRAME_HEADER + struct.unpack(">I", wal[8:12])[0]
    return {struct.unpack(">I", wal[at : at + 4])[0] for at in range(32, len(wal) - size + 1, size)}


def test_a_claim_and_a_completion_on_a_target_write_no_page_of_its_jobs_index(tmp_path: Path) -> None:
    db = tmp_path / "tether.db"
    with Coordinator.open(f"sqlite:///{db}", root=tmp_path / "data", registry=default_registry()) as c:
        c.enqueue_many([CreateFile(path="a.json", content=n, overwrite=True) for n in range(3)])
        bare = sqlite3.connect(db)
        try:
            assert bare.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0  # not busy: WAL emptied
            assert c.run_until_idle() == 3
            written = pages_in_wal(db)
            trees = {
                name: {p for n, p in bare.execute("SELECT name, pageno FROM dbstat") if n == name}
                for name in ("ix_tether_jobs_on_target", "ix_tether_jobs_target_active")
            }
        finally:
            bare.close()
    assert trees["ix_tether_jobs_target_active"] & written  # the frames are read right: the claims wrote it
    assert trees["ix_tether_jobs_on_target"] and not trees["ix_tether_jobs_on_target"] & written
