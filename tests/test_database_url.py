"""A database URL that cannot name a ledger is one ConfigError line, from every command and from
``Coordinator.open``, before anything connects; the password never shows."""

from __future__ import annotations

import pytest

from clikit import run_main
from tether import Coordinator
from tether.errors import ConfigError
from tether.ledger.url import parse_url

NOT_A_NUMBER = "postgresql://app:s3cret@127.0.0.1:notaport/app"

# Each malformed shape, and the words its error must hold.
MALFORMED = [
    (NOT_A_NUMBER, "its port 'notaport' is not a number"),
    ("postgresql://app:s3cret@127.0.0.1:/app", "its port '' is not a number"),
    ("postgresql://app:s3cret@[::1/app", "opens '[' without closing it"),
    ("postgresql://app:s3cret@h1:5432,h2:5433/app", "several hosts go in the query"),
    ("postgresql://app:s3cret@127.0.0.1:99999/app", "port 99999"),
    ("postgresql://app:s3cret@127.0.0.1:0/app", "port 0"),
    ("postgresql://app:s3cret@127.0.0.1/app?sslmod=require", "unknown connection option(s): sslmod"),
    ("postgresql://app:s3cret@127.0.0.1/app?sslmode=bogus", "sslmode must be one of"),
    ("postgresql://app:s3cret@127.0.0.1/app?connect_timeout=abc", "connect_timeout must be a whole number"),
    ("postgresql://app:s3cret@/app?host=127.0.0.1&port=notaport", "port must be a whole number"),
    ("postgresql://app:s3cret@/app?host=127.0.0.1&port=70000", "option port '70000' is out of range"),
    ("postgresql+asyncpg://app:s3cret@127.0.0.1/app", "unsupported driver 'asyncpg'"),
    ("postgresql+nodriver://app:s3cret@127.0.0.1/app", "unsupported driver 'nodriver'"),
    ("sqlite+pysqlcipher:///ledger.db", "unsupported driver 'pysqlcipher'"),
    ("mysql://app:s3cret@127.0.0.1/app", "unsupported database 'mysql'"),
    ("postgresql://app:s3c@s3cret@127.0.0.1/app", "an '@' in the user name or password must be written %40"),
    ("postgresql://app:s3cret@127.0.0.1/app?sslmode=require&sslmode=disable", "option sslmode is given 2 times"),
    ("sqlite:///ledger.db?mode=ro", "takes none"),
]


def test_coordinator_open_calls_a_port_that_is_not_a_number_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as raised:
        Coordinator.open(NOT_A_NUMBER, root=tmp_path)
    assert str(raised.value) == (
        "not a database URL: 'postgresql://app:***@127.0.0.1:notaport/app': its port 'notaport' is not a number "
        "(ports are 1 to 65535)"
    )


@pytest.mark.parametrize(("url", "problem"), MALFORMED)
def test_coordinator_open_refuses_each_malformed_url_with_a_config_error_naming_it(url, problem, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as raised:
        Coordinator.open(url, root=tmp_path / "data")
    assert problem in str(raised.value)
    assert "s3cret" not in str(raised.value)
    assert not (tmp_path / "ledger.db").exists() and not (tmp_path / "data").exists()  # nothing created


@pytest.mark.parametrize("command", [["status"], ["jobs"], ["enqueue", "create_file", "--payload", '{"path": "a"}']])
def test_a_port_that_is_not_a_number_in_tether_db_is_one_line_from_every_command(
    command, monkeypatch, capsys, tmp_path
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TETHER_DB", NOT_A_NUMBER)
    code, text = run_main(monkeypatch, capsys, *command)
    assert code == (3 if command == ["status"] else 1)
    assert "its port 'notaport' is not a number" in text and "s3cret" not in text
    lines = text.strip().splitlines()
    assert len(lines) <= 2 and all("tether" in line or "UNKNOWN" in line for line in lines), text


@pytest.mark.parametrize(("url", "problem"), MALFORMED)
def test_each_malformed_url_is_one_line_from_the_worker_and_reconcile(url, problem, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    for command in (["worker", "--until-idle"], ["reconcile"]):
        code, text = run_main(monkeypatch, capsys, "--db", url, *command)
        assert code == 1, (command, text)
        assert problem in text and "s3cret" not in text and len(text.strip().splitlines()) == 1, (command, text)


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///tether.db",
        "sqlite+pysqlite:////var/lib/tether.db",
        "postgresql://app@db.internal/app",
        "postgresql+psycopg://app:s3cret@db:5432/app?sslmode=verify-full&connect_timeout=5&application_name=w",
        "postgresql://app@db/app?options=-csearch_path%3Dtether",
        "postgresql://app@/app?host=h1:5432&host=h2:5433",
        "postgresql://app@[::1]:5432/app",
    ],
)
def test_well_formed_urls_pass_the_check(url):
    assert parse_url(url).get_backend_name() in ("sqlite", "postgresql")
