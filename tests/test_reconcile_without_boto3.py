"""``reconcile --untracked`` on an install without the ``aws`` extra: a ledger that never held a
``sync_aws`` job is checked without boto3; AWS is searched for untracked resources only on a
ledger with such jobs, or when ``--aws`` asks for it on any ledger.

boto3 is installed in the test environment, so each check runs in a process that cannot import it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tether import Coordinator
from tether.jobtypes.aws.sync import SyncAws
from tether.jobtypes.create_file import CreateFile

# ``tether ARGS`` in a Python whose imports of boto3 and botocore fail as on an install without them.
WITHOUT_BOTO3 = """
import sys

class NoAws:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("boto3", "botocore"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoAws())
for name in [m for m in sys.modules if m.partition(".")[0] in ("boto3", "botocore")]:
    del sys.modules[name]
from tether.cli import main
main()
"""


@pytest.fixture
def ledger(tmp_path: Path) -> tuple[str, Path]:
    """A ledger whose one job, a create_file, completed: nothing to do with AWS."""
    db, root = f"sqlite:///{tmp_path / 'tether.db'}", tmp_path / "data"
    with Coordinator.open(db, root=root) as coordinator:
        coordinator.enqueue(CreateFile(path="notes/a.json", content={"a": 1}))
        assert coordinator.run_until_idle() == 1
    return db, root


def reconcile_without_boto3(db: str, root: Path, *args: str) -> tuple[int, dict]:
    proc = subprocess.run(
        [sys.executable, "-c", WITHOUT_BOTO3, "--db", db, "--root", str(root), "reconcile", "--json", "-q", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def findings(report: dict) -> list[tuple[str, str, str | None]]:
    return [(f["path"], f["status"], f.get("detail")) for f in report["findings"]]


def test_untracked_check_of_a_ledger_without_aws_jobs_needs_no_boto3(ledger):
    code, report = reconcile_without_boto3(*ledger, "--untracked")
    assert code == 0, report
    assert findings(report) == [] and report["counts"]["in_sync"] == 1


def test_a_ledger_holding_a_sync_aws_job_is_searched_for_untracked_aws_resources(ledger):
    db, root = ledger
    with Coordinator.open(db, root=root) as coordinator:
        coordinator.enqueue(SyncAws(resource_type="s3_bucket", resource_id="logs", region="eu-west-1"))
    code, report = reconcile_without_boto3(db, root, "--untracked")
    assert code == 1, report  # could not list: never "none untracked"
    assert ("aws:*", "unknown", "could not list: No module named 'boto3'") in findings(report)


def test_an_explicit_aws_flag_searches_any_ledger_for_untracked_aws_resources(ledger):
    code, report = reconcile_without_boto3(*ledger, "--untracked", "--aws")
    assert code == 1, report
    assert findings(report) == [("aws:*", "unknown", "could not list: No module named 'boto3'")]


def test_no_aws_searches_no_ledger_for_untracked_aws_resources(ledger):
    db, root = ledger
    with Coordinator.open(db, root=root) as coordinator:
        coordinator.enqueue(SyncAws(resource_type="s3_bucket", resource_id="logs", region="eu-west-1"))
    code, report = reconcile_without_boto3(db, root, "--untracked", "--no-aws")
    assert code == 0, report
    assert [f[1] for f in findings(report)] == ["not_checked"]  # the sync_aws job is still pending
