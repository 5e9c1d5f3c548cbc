"""Outbox: the application's own row and tether's job commit in one transaction, or neither does.

The application keeps an ``orders`` table (SQLModel) in the same database as tether's ledger.
Placing an order adds the row and records the job that writes ``orders/<id>.json`` in one
session: both commit together, and a crash between them leaves neither (docs/design.md, "The
durability promise").

Run it from a clone (``make demo`` has created .venv):

    .venv/bin/python examples/outbox.py            # in a fresh temp directory
    .venv/bin/python examples/outbox.py --dir DIR  # DIR must not exist yet
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import orjson
import sqlalchemy as sa
from pydantic import BaseModel
from sqlmodel import Field, Session, SQLModel, select

from tether import Coordinator
from tether.store import JsonStore


class Order(SQLModel, table=True):
    """The application's own table: a row per order, in the ledger's database."""

    __tablename__ = "orders"
    id: str = Field(primary_key=True)
    customer: str
    total_cents: int


class OrderLine(BaseModel):
    sku: str
    quantity: int
    unit_cents: int


class OrderDocument(BaseModel):
    """The order as the data layer keeps it: a JSON file."""

    id: str
    customer: str
    lines: list[OrderLine]

    @property
    def total_cents(self) -> int:
        return sum(line.quantity * line.unit_cents for line in self.lines)


def place_order(store: JsonStore, doc: OrderDocument, *, crash_before_commit: bool = False) -> None:
    """The row and the job in one transaction. ``crash_before_commit`` simulates the process
    dying after both were written but before the commit."""
    with Session(store.coordinator.engine) as session:
        session.add(Order(id=doc.id, customer=doc.customer, total_cents=doc.total_cents))
        store.save(f"orders/{doc.id}.json", doc, session=session)  # joins the session's transaction
        if crash_before_commit:
            raise RuntimeError("simulated crash between the writes and the commit")
        session.commit()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", help="working directory to create (default: a new temp directory)")
    args = parser.parse_args(argv)
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="tether-outbox-"))
    work.mkdir(parents=True, exist_ok=True)
    if any(work.iterdir()):
        print(f"outbox: {work} is not empty; give a new directory", file=sys.stderr)
        return 1

    with Coordinator.open(f"sqlite:///{work / 'app.db'}", root=work / "data") as coordinator:
        SQLModel.metadata.create_all(coordinator.engine, tables=[Order.__table__])
        store = JsonStore(coordinator)
        print(f"database {work / 'app.db'} (the app's `orders` table and tether_jobs), data root {work / 'data'}")

        place_order(
            store,
            OrderDocument(
                id="o-1001",
                customer="acme",
                lines=[
                    OrderLine(sku="widget", quantity=3, unit_cents=1250),
                    OrderLine(sku="gear", quantity=1, unit_cents=4999),
                ],
            ),
        )
        print("placed o-1001: row + job committed together")
        try:
            place_order(
                store,
                OrderDocument(
                    id="o-1002", customer="globex", lines=[OrderLine(sku="widget", quantity=1, unit_cents=1250)]
                ),
                crash_before_commit=True,
            )
        except RuntimeError as e:
            print(f"placing o-1002 failed ({e}): the session rolled back")

        with Session(coordinator.engine) as session:
            orders = [o.id for o in session.exec(select(Order).order_by(Order.id))]
        with coordinator.engine.connect() as conn:
            jobs = conn.execute(sa.text("SELECT payload FROM tether_jobs")).scalars().all()
        paths = sorted(orjson.loads(p)["path"] for p in jobs)
        print(f"rows in orders: {orders}; jobs in tether_jobs: {paths}")

        done = store.flush()  # runs the committed job(s) here; a `tether worker` would do the same
        files = sorted(str(p.relative_to(work / "data")) for p in (work / "data").rglob("*.json"))
        print(f"after the worker: {len(done)} job(s) completed; files: {files}")
        ok = orders == ["o-1001"] and paths == ["orders/o-1001.json"] and files == ["orders/o-1001.json"]
        print("both or neither: " + ("yes" if ok else "NO"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
