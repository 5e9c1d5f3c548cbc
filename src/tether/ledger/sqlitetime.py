"""Times as a SQLite ledger keeps them: the fixed-width text SQLAlchemy's SQLite ``DateTime``
writes for a naive UTC time (``schema.UTCDateTime``), so that ``<`` on the text is time order.
Without SQLAlchemy, so ``observe.lite`` can use it too."""

from __future__ import annotations

from datetime import UTC, datetime

# Every two- and three-digit field as text, looked up: "%02d" formatting of seven integers is
# most of what writing a time costs, and an enqueue writes one.
_TWO = [f"{i:02d}" for i in range(100)]
_THREE = [f"{i:03d}" for i in range(1000)]


def to_text(value: datetime) -> str:
    """``value`` (timezone-aware) as the ledger's text, in UTC."""
    if value.tzinfo is not UTC:  # tether's clocks give UTC; any other zone is converted first
        if value.tzinfo is None:
            raise ValueError("tether stores timezone-aware UTC times only")
        value = value.astimezone(UTC)
    two, year, us = _TWO, value.year, value.microsecond
    return (
        f"{two[year // 100]}{two[year % 100]}-{two[value.month]}-{two[value.day]} "
        f"{two[value.hour]}:{two[value.minute]}:{two[value.second]}.{_THREE[us // 1000]}{_THREE[us % 1000]}"
    )


def from_text(text: str) -> datetime:
    """The ledger's text of a time, as a timezone-aware UTC datetime."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)
