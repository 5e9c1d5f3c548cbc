"""The AWS part of ``make demo``, in the demo's one ledger: a project model saved and its bucket
and queue synced in one transaction; drift made by hand (a tag changed, a queue deleted), which
``tether reconcile`` finds beside the files' drift.

It starts its own moto server (moto, a test dependency, stands in for AWS) on a free loopback
port with dummy credentials, and stops it at the end: the demo never talks to real AWS.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import BaseModel

if TYPE_CHECKING:
    from ..coordinator import Coordinator
    from ..store import JsonStore

_ENV = {
    "AWS_ACCESS_KEY_ID": "demo",
    "AWS_SECRET_ACCESS_KEY": "demo",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}


def available() -> str | None:
    """Why the AWS part cannot run here, or None."""
    try:
        import boto3  # noqa: F401
        import moto  # noqa: F401
    except ImportError as e:
        return f"{e.name} is not installed (pip install -e '.[test]')"
    return None


@contextmanager
def moto_server() -> Iterator[str]:
    """``python -m moto.server`` on a free loopback port; this process's boto3 points at it."""
    from ..jobtypes.aws import reset_clients

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in [*_ENV, "AWS_ENDPOINT_URL", "AWS_PROFILE", "AWS_SESSION_TOKEN"]}
    try:
        _wait_for(port, proc)
        os.environ.pop("AWS_PROFILE", None)
        os.environ.pop("AWS_SESSION_TOKEN", None)
        os.environ.update(_ENV, AWS_ENDPOINT_URL=url)
        reset_clients()
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        reset_clients()


def _wait_for(port: int, proc: subprocess.Popen[bytes], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the moto server did not start") from None
            time.sleep(0.1)


def pair(c: Coordinator, store: JsonStore, project: tuple[str, BaseModel], say: Callable[[str], Any]) -> None:
    """Step 5 of the demo: ``project`` (its path and model) saved with its bucket and queue, in
    one transaction of the application's, then run."""
    from sqlalchemy.orm import Session

    say("\n5. AWS resources paired with a model, in the same ledger (a moto server on loopback stands in for AWS)")
    with Session(c.engine) as session:
        ids = {
            store.save(*project, session=session).id,
            store.sync_aws(
                "s3_bucket", "apollo-assets", {"versioning": True, "tags": {"project": "apollo"}}, session=session
            ).id,
            store.sync_aws("sqs_queue", "apollo-jobs", {"attributes": {"VisibilityTimeout": 60}}, session=session).id,
        }
        session.commit()
    say(f"   one transaction: save {project[0]} + sync_aws s3_bucket apollo-assets + sqs_queue apollo-jobs")
    for job in store.flush():  # the store's earlier jobs too (a worker ran them): these three shown
        if job.id in ids:
            say(f"   {job.type:<12} {job.status.value:<10} {_shown(job.result)}")


def _shown(result: str | None) -> str:
    """A job's result as the walk-through prints it: without a file's fingerprint, a stat that
    differs from run to run (and is null when taken within a timestamp tick of the write)."""
    if not result:
        return ""
    data = orjson.loads(result)
    if isinstance(data, dict):
        data.pop("fingerprint", None)
    return orjson.dumps(data).decode()


def damage() -> str:
    """Drift made by hand in AWS, as a console user would: the bucket's project tag changed, the
    queue deleted. Returns what was done, for the demo to say."""
    import boto3

    s3, sqs = boto3.client("s3"), boto3.client("sqs")
    tags = s3.get_bucket_tagging(Bucket="apollo-assets")["TagSet"]
    s3.put_bucket_tagging(
        Bucket="apollo-assets",
        Tagging={"TagSet": [t if t["Key"] != "project" else {"Key": "project", "Value": "hermes"} for t in tags]},
    )
    sqs.delete_queue(QueueUrl=sqs.get_queue_url(QueueName="apollo-jobs")["QueueUrl"])
    return "in AWS: tag project=hermes on bucket apollo-assets; delete queue apollo-jobs"
