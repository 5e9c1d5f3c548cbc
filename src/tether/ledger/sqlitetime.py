"""Times as a SQLite ledger keeps them: the fixed-width text SQLAlchemy's SQLite ``DateTime``
writes for a naive UTC time (``schema.UTCDateTime``), so that ``<`` on the text is time order.
Without SQLAlchemy, so ``observe.lite`` can use it too."""

from __future__ import annotations

from datetime import UTC, datetime


def to_text(value: datetime) -> str:
    """``value`` (timezone-aware) as the ledger's text, in UTC."""
    if value.tzinfo is not UTC:  # tether's clocks give UTC; any other zone is converted first
        if value.tzinfo is None:
            raise ValueError("tether stores timezone-aware UTC times only")
        value = value.astimezone(UTC)
    # Spelled out rather than isoformat(), which formats the zone only for it to be cut off:
    # one call per time, on every job enqueued or recorded.
    return "%04d-%02d-%02d %02d:%02d:%02d.%06d" % (  # noqa: UP031 (cheaper than an f-string here)
        value.year,
        value.month,
        value.day,
        value.hour,
        value.minute,
        value.second,
        value.microsecond,
    )


def from_text(text: str) -> datetime:
    """The ledger's text of a time, as a timezone-aware UTC datetime."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)
