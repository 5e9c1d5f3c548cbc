"""The statement catalogue (tether/ledger/statements/*.sql): each file complete in its dialect,
the two files alike in what they name, and each condition spelled as the schema defines it."""

from __future__ import annotations

import re

import pytest

from tether.ledger import catalogue
from tether.ledger.catalogue import INLINE_PAYLOAD, POSTGRESQL, READS, SQLITE, Statements, parse
from tether.ledger.schema import ACTIVE_KEYED_SQL, ACTIVE_SQL, jobs
from tether.ledger.status import JobStatus

BOTH = pytest.mark.parametrize("statements", [SQLITE, POSTGRESQL], ids=["sqlite", "postgresql"])


def every_statement() -> list[tuple[str, str]]:
    out = [(f"sqlite {n}", s) for n, s in SQLITE.named().items()]
    out += [(f"postgresql {n}", s) for n, s in POSTGRESQL.named().items()]
    return out + [(f"reads {n}", getattr(READS, n)) for n in READS.__dataclass_fields__]


def test_a_file_that_names_a_statement_twice_or_leaves_one_out_is_refused(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="named twice"):
        parse("-- name: GET\nSELECT 1\n-- name: GET\nSELECT 2\n")
    monkeypatch.setattr(catalogue, "STATEMENTS", tmp_path)
    (tmp_path / "sqlite.sql").write_text("-- name: GET\nSELECT 1\n-- name: SOMETHING_ELSE\nSELECT 2\n")
    with pytest.raises(ValueError, match=r"missing \[.*'CLAIM'.*\], not known \['SOMETHING_ELSE'\]"):
        catalogue.load("sqlite", Statements, dialect="sqlite")


def test_comment_lines_are_documentation_and_never_sent():
    assert parse("-- head\n-- name: A\n-- why\nSELECT 1\n  -- indented why\nFROM t\n\n-- between\n") == {
        "A": "SELECT 1\nFROM t"
    }
    for name, statement in every_statement():
        assert not [line for line in statement.splitlines() if line.lstrip().startswith("--")], name


@BOTH
def test_each_dialect_is_written_in_its_own_placeholders(statements: Statements):
    for name, statement in statements.named().items():
        if statements.dialect == "postgresql":
            assert not re.search(r"(?<![:\w]):\w", statement), f"{name} has a :name placeholder"
            assert "INDEXED BY" not in statement, f"{name} pins an index: PostgreSQL has no such clause"
        else:
            assert "%(" not in statement and "%s" not in statement, f"{name} has a psycopg placeholder"


def test_the_sqlite_statements_pin_only_indexes_the_schema_defines():
    defined = {index.name for index in jobs.indexes}
    pinned = {m for s in SQLITE.named().values() for m in re.findall(r"INDEXED BY (\w+)", s)}
    assert pinned and pinned <= defined, pinned - defined


def test_the_active_set_is_spelled_as_the_schema_defines_it_in_every_statement():
    # SQLite uses a partial index only when the statement's condition is the index's own.
    spelled = 0
    for name, statement in every_statement():
        for found in re.findall(r"status IN \([^)]*\)", statement):
            listed = set(re.findall(r"'(\w+)'", found))
            assert listed <= {s.value for s in JobStatus}, (name, found)
            if listed == {"pending", "claimed"}:
                assert found == ACTIVE_SQL, f"{name} spells the active set as {found!r}, not {ACTIVE_SQL!r}"
                spelled += 1
    assert spelled > 10


@BOTH
def test_the_keyed_insert_conflicts_on_the_unique_index_condition(statements: Statements):
    # ON CONFLICT names the partial unique index by its condition, which must be the index's.
    assert f"ON CONFLICT (type, idempotency_key) WHERE {ACTIVE_KEYED_SQL} DO NOTHING" in statements.INSERT


@BOTH
def test_the_claim_inlines_payloads_up_to_the_size_named_in_python(statements: Statements):
    assert f"<= {INLINE_PAYLOAD} THEN" in statements.CLAIM


def test_job_types_are_bound_as_each_dialect_reads_a_list():
    assert SQLITE.types({"b", "a"}) == '["a","b"]'  # json_each
    assert POSTGRESQL.types({"b", "a"}) == ["a", "b"]  # = ANY


@BOTH
def test_a_group_commit_changes_a_row_exactly_as_the_transition_it_is_named_after(statements: Statements):
    for name in ("COMPLETE", "RETRY", "FAIL", "RELEASE", "DEFER"):
        returning = getattr(statements, name)
        without, _, _ = returning.partition("\nRETURNING ")
        assert getattr(statements, f"{name}_NO_RETURN") == without, name
