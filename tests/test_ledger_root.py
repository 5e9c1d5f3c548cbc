"""A ledger knows the data root it was created for: omitted roots use it, a different one is
refused unless the operator records a move, and only a new ledger creates its root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import sqlalchemy as sa

from clikit import run_split
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


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """``tether ARGS`` in this process (clikit.run_split), from ``tmp_path``, no TETHER_* settings:
    exit code, stdout, stderr. What is under test is which root is used, not a process start."""
    for name in [k for k in os.environ if k.startswith("TETHER_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return lambda *args: run_split(monkeypatch, capsys, *args)


def test_a_mistyped_root_on_the_command_line_is_refused_and_never_created(tmp_path, cli):
    db = f"sqlite:///{tmp_path / 'tether.db'}"
    with Coordinator.open(db, root=tmp_path / "data") as c:  # the README's Python example
        c.enqueue(CreateFile(path="people/ada.json", content={"name": "Ada"}))
        c.run_until_idle()
    code, _, err = cli("--db", db, "--root", "typo-root", "worker", "--until-idle")
    assert code == 1 and "this ledger's data root is" in err and "Traceback" not in err
    assert not (tmp_path / "typo-root").exists()
    code, out, err = cli("--db", db, "reconcile", "--quiet")  # no --root: the recorded one
    assert code == 0 and "1 in_sync" in out, out + err
    moved = tmp_path / "elsewhere"
    (tmp_path / "data").rename(moved)
    code, out, err = cli("--db", db, "--root", str(moved), "--moved", "reconcile", "--quiet")
    assert code == 0, out + err
    assert cli("--db", db, "reconcile", "--quiet")[0] == 0


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
