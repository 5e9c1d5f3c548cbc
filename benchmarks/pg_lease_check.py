"""What asking the ledger before each effect costs a create_file drain on PostgreSQL.

    .venv/bin/python benchmarks/pg_lease_check.py [--jobs 3000] [--rounds 8]

On PostgreSQL a worker asks the ledger whether it still holds a job before each file effect (a
worker on another machine may have been paused in a way its own clocks do not see, while the
others took its jobs); on SQLite, whose workers share one machine, a claim younger than half the
lock timeout is trusted without asking. This drains the same create_file jobs (one worker, one
thread, a fresh database per run) with the lease asked, as tether does, and trusted, as it did
before, alternating the two sides in short rounds, and prints files/s and their ratio.
"""

from __future__ import annotations

import argparse
import secrets
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

from _common import machine, median
from tether import Coordinator, CreateFile
from tether.ledger.backend import PostgresBackend

ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def drain(jobs: int, trusted: bool) -> float:
    """files/s of one drain of ``jobs`` create_file jobs in a fresh database."""
    name = f"lease_{secrets.token_hex(4)}"
    admin = sa.create_engine(ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    PostgresBackend.one_machine = trusted  # the side measured (the class's own value: asked)
    try:
        with tempfile.TemporaryDirectory() as d:
            url = sa.make_url(ADMIN).set(database=name).render_as_string(hide_password=False)
            with Coordinator.open(url, root=Path(d) / "root") as coordinator:
                coordinator.enqueue_many(
                    [CreateFile(path=f"d{i % 20}/f{i}.json", content={"i": i}) for i in range(jobs)]
                )
                start = time.perf_counter()
                ran = coordinator.run_until_idle()
                took = time.perf_counter() - start
        assert ran == jobs, ran
        return jobs / took
    finally:
        PostgresBackend.one_machine = False
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    asked, trusted = [], []
    for n in range(args.rounds):
        for trust in (True, False) if n % 2 == 0 else (False, True):
            (trusted if trust else asked).append(drain(args.jobs, trust))
    print(machine())
    print(f"create_file drain on PostgreSQL, {args.jobs} jobs, {args.rounds} rounds alternated (files/s)")
    print(f"  lease trusted for half the lock timeout: median {median(trusted):,.0f}  {[round(x) for x in trusted]}")
    print(f"  ledger asked before each effect:         median {median(asked):,.0f}  {[round(x) for x in asked]}")
    print(f"  asked / trusted: {median(asked) / median(trusted):.3f}")


if __name__ == "__main__":
    main()
