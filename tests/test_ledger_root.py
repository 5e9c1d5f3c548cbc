"""A ledger knows the data root it was created for: omitted roots use it, a different one is
refused unless the operator records a move, and only a new ledger creates its root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from tether import Coordinator, CreateFile
from tether.ledger.meta import RootMismatch


def test_a_new_ledger_records_its_root_and_later_opens_use_it(db_url, tmp_path, monkeypatch):
    root = tmp_path / "data"
    with Coordinator.open(db_url, root=root) as c:
        assert c.root == root and root.is_dir() and c.ledger_id
        ledger_id = c.ledger_id
    monkeypatch.chdir(tmp_path / "data")  # anywhere else
    monkeypatch.delenv("TETHER_ROOT", raising=False)
    with Coordinator.open(db_url) as c:
        assert c.root == root and c.ledger_id == ledger_id


def test_another_root_is_refused_naming_both_unless_the_move_is_recorded(db_url, tmp_path):
    old, new = tmp_path / "data", tmp_path / "moved"
    Coordinator.open(db_url, root=old).close()
    new.mkdir()
    with pytest.raises(RootMismatch) as refused:
        Coordinator.open(db_url, root=new)
    assert str(old) in str(refused.value) and str(new) in str(refused.value) and "--moved" in str(refused.value)
    with Coordinator.open(db_url, root=new, moved=True) as c:
        assert c.root == new
    with Coordinator.open(db_url) as c:
        assert c.root == new  # the move was recorded
    with Coordinator.open(db_url, root=os.path.relpath(new)) as c:  # another spelling of the same root
        assert c.root == new.absolute()


def test_only_a_new_ledger_creates_its_root(db_url, tmp_path):
    root = tmp_path / "data"
    Coordinator.open(db_url, root=root).close()
    root.rmdir()
    with pytest.raises(Exception, match="does not exist"):
        Coordinator.open(db_url)
    assert not root.exists()


def test_a_ledger_from_before_roots_were_recorded_adopts_the_root_given(db_url, tmp_path):
    root = tmp_path / "data"
    with Coordinator.open(db_url, root=root) as c:
        c.enqueue(CreateFile(path="a.json", content=1))
    engine = sa.create_engine(db_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE tether_meta")  # as an earlier version left it
    engine.dispose()
    with Coordinator.open(db_url, root=root) as c:
        assert c.run_until_idle() == 1
    with Coordinator.open(db_url) as c:
        assert c.root == root


def test_a_ledger_of_a_newer_tether_is_refused(db_url, tmp_path):
    Coordinator.open(db_url, root=tmp_path / "data").close()
    engine = sa.create_engine(db_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE tether_meta SET value = '999' WHERE key = 'schema_version'")
    engine.dispose()
    with pytest.raises(Exception, match="last opened by a newer tether"):
        Coordinator.open(db_url, root=tmp_path / "data")


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    return subprocess.run(
        [sys.executable, "-m", "tether", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def test_a_mistyped_root_on_the_command_line_is_refused_and_never_created(tmp_path):
    db = f"sqlite:///{tmp_path / 'tether.db'}"
    with Coordinator.open(db, root=tmp_path / "data") as c:  # the README's Python example
        c.enqueue(CreateFile(path="people/ada.json", content={"name": "Ada"}))
        c.run_until_idle()
    done = cli("--db", db, "--root", "typo-root", "worker", "--until-idle", cwd=tmp_path)
    assert done.returncode == 1 and "this ledger's data root is" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "typo-root").exists()
    checked = cli("--db", db, "reconcile", "--quiet", cwd=tmp_path)  # no --root: the recorded one
    assert checked.returncode == 0 and "1 in_sync" in checked.stdout, checked.stdout + checked.stderr
    moved = tmp_path / "elsewhere"
    (tmp_path / "data").rename(moved)
    done = cli("--db", db, "--root", str(moved), "--moved", "reconcile", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert cli("--db", db, "reconcile", "--quiet", cwd=tmp_path).returncode == 0


def test_the_aws_ownership_id_is_the_recorded_one_and_survives_moving_the_ledger_file(tmp_path, monkeypatch):
    monkeypatch.delenv("TETHER_LEDGER_ID", raising=False)
    first = tmp_path / "first.db"
    with Coordinator.open(f"sqlite:///{first}", root=tmp_path / "data") as c:
        recorded = c.ledger_id
        assert c.queue.ledger_id == recorded  # one id: what the jobs tag AWS resources with
    moved = tmp_path / "elsewhere" / "moved.db"
    moved.parent.mkdir()
    first.rename(moved)
    with Coordinator.open(f"sqlite:///{moved}") as c:
        assert (c.ledger_id, c.queue.ledger_id) == (recorded, recorded)
    monkeypatch.setenv("TETHER_LEDGER_ID", "shared-owner")
    with Coordinator.open(f"sqlite:///{moved}") as c:
        assert (c.ledger_id, c.queue.ledger_id) == ("shared-owner", "shared-owner")
