"""The per-type views (issue 18): AWS resources with their latest job and drift, AI extractions'
spend by model and verdicts; as functions on both databases, and as pages of ``tether ui``.

Rows are written as the job types leave them (results, ``last_error`` verdicts), straight into
the table: what is read back is the point here, the types' own runs have their own tests."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import orjson
import pytest
import sqlalchemy as sa
from starlette.testclient import TestClient

from tether import Coordinator, ui
from tether.jobtypes import Registry
from tether.jobtypes.base import IN_SYNC, MODIFIED, NOT_EQUAL, Difference
from tether.jobtypes.create_file import CreateFileType
from tether.ledger import schema
from tether.observe import extractions, resources
from tether.reconcile.drift import STATUSES, Finding, Report
from tether.ui.driftrun import DriftState

BASE = "http://127.0.0.1:8787"
_n = 0


def row(now: datetime, job_type: str, status: str, **fields: Any) -> dict[str, Any]:
    global _n
    _n += 1
    created = fields.pop("created_at", now - timedelta(minutes=30))
    finished = status in ("completed", "failed")
    result = fields.pop("result", None)
    return {
        "id": f"{created:%Y%m%d%H%M%S}{_n:012d}",
        "type": job_type,
        "payload": "{}",
        "status": status,
        "attempts": 1 if status != "pending" else 0,
        "created_at": created,
        "run_at": created,
        "claimed_at": created + timedelta(seconds=1) if status != "pending" else None,
        "completed_at": created + timedelta(seconds=2) if finished else None,
        "result": None if result is None else orjson.dumps(result).decode(),
        "idempotency_key": None,
        "ordering_key": None,
        "last_error": None,
        **fields,
    }


def insert(c: Coordinator, rows: list[dict[str, Any]]) -> None:
    with c.engine.begin() as conn:
        conn.execute(sa.insert(schema.jobs), rows)


def aws_ledger(c: Coordinator) -> dict[str, str]:
    """Three buckets: logs (created, then changed), data (deleted), new (its first sync failed)."""
    now = c.clock.now()
    logs, data, new = (f"aws:s3_bucket:eu-west-1:{name}" for name in ("logs", "data", "new"))
    rows = [
        row(now, "sync_aws", "completed", ordering_key=logs, created_at=now - timedelta(hours=2),
            result={"state": "present", "changed": True, "created": True, "arn": "arn:aws:s3:::logs"}),
        row(now, "sync_aws", "completed", ordering_key=logs,
            result={"state": "present", "changed": True, "fields": ["tags"], "arn": "arn:aws:s3:::logs"}),
        row(now, "sync_aws", "completed", ordering_key=data, result={"state": "absent", "changed": True}),
        row(now, "sync_aws", "failed", ordering_key=new, last_error="AccessDenied: not yours"),
        row(now, "create_file", "completed", ordering_key="file:a.json", result={"bytes": 1}),
    ]  # fmt: skip
    insert(c, rows)
    return {"logs": rows[1]["id"], "data": rows[2]["id"], "new": rows[3]["id"]}


def extraction_ledger(c: Coordinator) -> None:
    """In the window: 2 answers by sonnet, 1 by haiku, 1 landed from disk, 2 failed (rate limited,
    out of budget), 1 waiting to retry (overloaded); a day earlier, one more answer (outside)."""
    now = c.clock.now()

    def answer(model: str, cost: float, tokens: int, **fields: Any) -> dict[str, Any]:
        bill = {"cost_usd": cost, "input_tokens": tokens, "output_tokens": tokens // 2, "model": model}
        return row(now, "claude_extraction", "completed", result={"bytes": 10, "prompt_hash": "h", **bill}, **fields)

    rows = [
        answer("sonnet", 0.25, 1000, idempotency_key="r1:h"),
        answer("sonnet", 0.5, 3000, idempotency_key="r2:h"),
        answer("haiku", 0.01, 100, idempotency_key="r3:h"),
        answer("sonnet", 9.0, 9, idempotency_key="r0:h", created_at=now - timedelta(hours=30)),
        row(now, "claude_extraction", "completed", idempotency_key="r4:h",
            result={"bytes": 10, "prompt_hash": "h", "assistant_called": False, "written": False}),
        row(now, "claude_extraction", "failed", idempotency_key="r5:h",
            last_error="verdict=rate_limited; exit=1; stderr: slow down"),
        row(now, "claude_extraction", "failed", idempotency_key="r6:h", last_error="verdict=out_of_budget; exit=1"),
        row(now, "claude_extraction", "pending", idempotency_key="r7:h", attempts=1,
            last_error="verdict=overloaded; exit=1; stderr: 529"),
        row(now, "create_file", "completed", result={"cost_usd": 5.0}),  # not an extraction type
    ]  # fmt: skip
    insert(c, rows)


def test_aws_resources_lists_each_target_with_its_latest_job(coordinator: Coordinator) -> None:
    ids = aws_ledger(coordinator)
    page = resources.aws_resources(coordinator)
    assert [(r.resource_id, r.job.id, r.state, r.changed) for r in page.resources] == [
        ("data", ids["data"], "absent", True),
        ("logs", ids["logs"], "present", True),
        ("new", ids["new"], None, None),
    ]
    logs = page.resources[1]
    assert (logs.resource_type, logs.region, logs.identity) == ("s3_bucket", "eu-west-1", {"arn": "arn:aws:s3:::logs"})
    assert page.after is None
    first = resources.aws_resources(coordinator, limit=2)
    rest = resources.aws_resources(coordinator, after=first.after, limit=2)
    assert [r.resource_id for r in first.resources] == ["data", "logs"] and first.after is not None
    assert [r.resource_id for r in rest.resources] == ["new"] and rest.after is None


def test_extractions_sum_spend_by_model_and_count_verdicts(coordinator: Coordinator) -> None:
    extraction_ledger(coordinator)
    found = extractions.extractions(coordinator, since=timedelta(hours=24))
    assert [(s.model, s.jobs, s.cost_usd, s.input_tokens, s.output_tokens) for s in found.spend] == [
        ("sonnet", 2, 0.75, 4000, 2000),
        ("haiku", 1, 0.01, 100, 50),
    ]
    assert (found.cost_usd, found.billed, found.unbilled) == (0.76, 3, 1)
    assert [(v.verdict, v.failed, v.waiting) for v in found.verdicts] == [
        ("out_of_budget", 1, 0),
        ("overloaded", 0, 1),
        ("rate_limited", 1, 0),
    ]
    assert extractions.extractions(coordinator, since=timedelta(hours=48)).cost_usd == 9.76


def test_verdict_of_an_error_without_one_is_its_summary() -> None:
    assert extractions.verdict_of("verdict=not_installed; exit=killed") == "not_installed"
    assert extractions.verdict_of("Traceback (most recent call last):\n  ...\nJobTimedOut: 600s") == "JobTimedOut: 600s"


@pytest.fixture
def app(coordinator: Coordinator):
    return ui.app(coordinator)


@pytest.fixture
def web(app):
    with TestClient(app, base_url=BASE) as client:
        yield client


def test_aws_page_shows_resources_identity_and_the_last_checks_drift(
    coordinator: Coordinator, app, web, monkeypatch
) -> None:
    ids = aws_ledger(coordinator)
    before = web.get("/aws").text
    assert 'href="/aws"' in before  # in the navigation: the registry has sync_aws
    assert "arn:aws:s3:::logs" in before and "no check recorded" in before
    assert f'href="/jobs/{ids["new"]}"' in before and "AccessDenied" not in before
    # A check found the logs bucket's tags changed by hand.
    tags = Difference("tags.team", "data", "web", NOT_EQUAL)
    finding = Finding("s3_bucket:eu-west-1:logs", MODIFIED, ids["logs"], "sync_aws", differences=(tags,))
    now = coordinator.clock.now()
    counts = {**dict.fromkeys(STATUSES, 0), IN_SYNC: 2, MODIFIED: 1}
    report = Report(now, content=True, untracked=False, counts=counts, findings=[finding], finished_at=now)
    monkeypatch.setattr(app.state.pages.drift, "state", lambda: DriftState(False, now, report, None))
    after = web.get("/aws").text
    assert "1 AWS finding(s)" in after and '<span class="badge modified">modified</span>' in after
    assert "<code>tags.team</code> NOT_EQUAL" in after and after.count("in sync") == 2


def test_extractions_page_shows_cost_models_and_verdicts(coordinator: Coordinator, web) -> None:
    extraction_ledger(coordinator)
    page = web.get("/extractions", params={"window": "24h"}).text
    assert 'href="/extractions"' in page and "$0.7600" in page
    assert '<td>sonnet</td><td class="num">2</td><td class="num">0.7500</td>' in page
    assert '<td class="err">overloaded</td><td class="num">0</td><td class="num">1</td>' in page
    assert "1</span> landed from an answer already on disk" in page
    wider = web.get("/extractions", params={"window": "48h"}).text
    assert "$9.7600" in wider
    assert 'name="window" value="1h"' in web.get("/extractions").text  # an hour by default
    assert web.get("/extractions", params={"window": "soon"}).status_code == 400


def test_type_pages_are_offered_only_where_their_types_exist(tmp_path) -> None:
    files_only = Registry([CreateFileType()])
    c = Coordinator.open(f"sqlite:///{tmp_path / 't.db'}", root=tmp_path / "data", registry=files_only)
    try:
        with TestClient(ui.app(c), base_url=BASE) as client:
            page = client.get("/").text
        with TestClient(ui.app(c.engine), base_url=BASE) as client:
            bare = client.get("/").text
    finally:
        c.close()
    assert 'href="/aws"' not in page and 'href="/extractions"' not in page
    assert 'href="/aws"' in bare and 'href="/extractions"' in bare  # a bare engine: no registry to ask
