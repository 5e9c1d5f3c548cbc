"""What a person sees when something goes wrong: the error's type and message on the first line
(the traceback after it, in ``tether show``), and never a database password."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import orjson
import pytest

from clikit import run_main
from jobkit import Note, NoteType, registry_with
from tether import SystemClock
from tether.errors import PermanentError
from tether.ledger.lifecycle import error_text
from tether.ledger.url import mask_url

# -- item 10: ExceptionType: message first -------------------------------------------------------


def test_an_unexpected_error_reads_type_and_message_first_and_keeps_its_traceback(
    make_coordinator, db_url, caplog, capsys, monkeypatch
):
    c = make_coordinator(registry_with(NoteType()), clock=SystemClock())  # the CLI reads the system clock
    job_id = c.enqueue(Note(name="a", fail_times=1), max_attempts=1).id
    with caplog.at_level(logging.INFO, logger="tether.events"):
        c.run_until_idle()
    first, rest = c.get(job_id).last_error.split("\n", 1)
    assert first == "RuntimeError: a failed on run 1"
    assert rest.startswith("Traceback (most recent call last):") and "jobkit.py" in rest
    assert rest.rstrip().endswith("RuntimeError: a failed on run 1")
    [failed] = [orjson.loads(r.getMessage()) for r in caplog.records if '"event":"failed"' in r.getMessage()]
    assert failed["error"] == "RuntimeError: a failed on run 1"
    for command in (["failed"], ["jobs"], ["recent"]):
        code, text = run_main(monkeypatch, capsys, "--db", db_url, *command)
        assert code == 0 and "RuntimeError: a failed on run 1" in text, command
        assert "Traceback" not in text
    code, text = run_main(monkeypatch, capsys, "--db", db_url, "show", job_id)
    assert code == 0 and "RuntimeError: a failed on run 1" in text and "Traceback (most recent call last)" in text


def test_every_error_text_starts_with_its_type():
    def raised(error: BaseException) -> BaseException:
        try:
            raise error
        except BaseException as e:
            return e

    assert error_text(raised(KeyError("k"))).split("\n")[0] == "KeyError: 'k'"
    assert error_text(raised(ValueError())).split("\n")[0] == "ValueError"
    assert error_text(raised(OSError(28, "No space left on device"))).split("\n")[0] == (
        "OSError: [Errno 28] No space left on device"
    )
    multi = error_text(raised(RuntimeError("first\nsecond")))
    assert multi.split("\n")[0] == "RuntimeError: first" and "second" in multi
    assert error_text(PermanentError("never\ndetail")) == "PermanentError: never\ndetail"  # no traceback


# -- item 6: passwords masked --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://app:s3cret@db/app", "postgresql://app:***@db/app"),
        ("postgresql+psycopg://app:s3cret@db:5432/app?sslmode=require", "postgresql+psycopg://app:***@db:5432/app"),
        ("postgresql://app@db/app?password=s3cret", "postgresql://app@db/app?password=***"),
        ("postgresql//app:s3cret@db/app", "postgresql//app:***@db/app"),  # not a URL at all
        ("postgresql://app:s3:c@r@et@db/app", "postgresql://app:***@db/app"),
        ("app:s3cret@db", "app:***@db"),
        ("sqlite:///tether.db", "sqlite:///tether.db"),
    ],
)
def test_mask_url_hides_the_password_of_any_url_or_near_url(url, shown):
    assert mask_url(url).startswith(shown) and "s3cret" not in mask_url(url) and "s3:c" not in mask_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql//app:s3cret@db/app",  # mistyped: "not a database URL"
        "postgresql://app:s3cret@127.0.0.1:1/app",  # nothing listens on port 1
        "postgresql://app@127.0.0.1:1/app?password=s3cret",
    ],
)
def test_no_command_prints_the_password_of_the_database_url(url, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    for command in (
        ["status"],
        ["jobs"],
        ["failed"],
        ["enqueue", "create_file", "--payload", '{"path": "a", "text": "x"}'],
        ["worker", "--until-idle"],
        ["reconcile"],
    ):
        code, text = run_main(monkeypatch, capsys, "--db", url, *command)
        assert code != 0, command
        assert "s3cret" not in text and "***" in text, (command, text)
        assert "Traceback" not in text


def test_status_with_a_mistyped_url_in_the_environment_masks_it(tmp_path):
    env = {**os.environ, "TETHER_DB": "postgresql//app:s3cret@db/app"}
    proc = subprocess.run(
        [sys.executable, "-m", "tether", "status"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 3
    assert proc.stderr.strip() == (
        "tether: UNKNOWN: not a database URL: 'postgresql//app:***@db/app' (expected e.g. sqlite:///tether.db)"
    )
