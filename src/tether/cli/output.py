"""What every read command shares: opening the ledger read-only, tables, durations."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import ConfigError
from .app import Settings, out

if TYPE_CHECKING:
    import sqlalchemy as sa

    from ..ledger.record import JobRecord

LIMIT_HELP = "Show at most this many jobs (0 for all)."


class InvalidDuration(ConfigError):
    """A duration option is not a number followed by a unit (s, m, h, d, w)."""


_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str, option: str) -> timedelta:
    """``90s``, ``15m``, ``1h30m``, ``7d``, ``2w`` -> timedelta; anything else: InvalidDuration."""
    value = text.strip().lower()
    if not value or _PART.sub("", value):
        raise InvalidDuration(
            f"{option}: {text!r} is not a duration; use a number and a unit, e.g. 90s, 15m, 1h30m, 7d"
        )
    return timedelta(seconds=sum(float(n) * _UNITS[u] for n, u in _PART.findall(value)))


def limit_value(limit: int) -> int | None:
    if limit < 0:
        raise ConfigError(f"--limit must be 0 (all) or more, not {limit}")
    return limit or None


@contextmanager
def ledger(settings: Settings) -> Iterator[sa.Engine]:
    """The ledger named by --db / TETHER_DB, opened for reading; never creates one."""
    from ..observe.readonly import open_ledger

    engine = open_ledger(settings.db, schema=settings.schema)
    try:
        yield engine
    finally:
        engine.dispose()


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]], *, empty: str = "none") -> None:
    """A rich table; or, with no rows, one line saying so."""
    from rich.table import Table

    rows = list(rows)
    if not rows:
        out.print(f"{title}: {empty}" if title else empty)
        return
    tab = Table(title=title, title_justify="left", header_style="bold")
    for i, col in enumerate(columns):
        numeric = all(isinstance(row[i], int) for row in rows)
        # Ids and times stay whole (they are copied into the next command); prose folds.
        whole = col in ("id", "retried", "type", "status", "attempts") or "(UTC)" in col
        tab.add_column(col, overflow="fold", no_wrap=whole, justify="right" if numeric else "left")
    for row in rows:
        tab.add_row(*("" if v is None else str(v) for v in row))
    out.print(tab)


def when(value: datetime | None) -> str:
    """A time as operators read it: UTC, to the second."""
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def age(seconds: float | None) -> str:
    """``95`` -> ``1m35s``; ``None`` -> ``-``."""
    if seconds is None:
        return "-"
    s = int(round(seconds))
    if s < 60:
        return f"{seconds:.3g}s" if seconds < 10 else f"{s}s"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            major, rest = divmod(s, size)
            minor_unit, minor_size = {"d": ("h", 3600), "h": ("m", 60), "m": ("s", 1)}[unit]
            return f"{major}{unit}{rest // minor_size}{minor_unit}" if rest // minor_size else f"{major}{unit}"
    return f"{s}s"


def size(value: int | None) -> str:
    """Bytes as operators read them: ``5242880`` -> ``5.0 MiB``; ``None`` -> ``-``."""
    if value is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value} B"


def seconds(value: float) -> str:
    """A duration in seconds for the durations table: ms below one second."""
    return f"{value * 1000:.1f}ms" if value < 1 else f"{value:.2f}s"


def first_line(text: str | None, width: int = 100) -> str:
    if not text:
        return ""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


def job_dicts(jobs: Iterable[JobRecord]) -> list[dict[str, Any]]:
    return [j.to_dict() for j in jobs]


def noted_dicts(engine: Any, jobs: list[JobRecord]) -> list[dict[str, Any]]:
    """``job_dicts`` with each job's tags, meta and retry links (observe/tags.py; never the payload)."""
    from ..observe.tags import notes

    noted = notes(engine, [j.id for j in jobs])
    return [{**j.to_dict(), **noted[j.id]} for j in jobs]


def progress_text(progress: str | None) -> str:
    """A running job's progress as a person reads it: ``40/100 (40%) copying``."""
    if not progress:
        return ""
    data = orjson.loads(progress)
    done, total, note = data.get("done"), data.get("total"), data.get("note")
    text = f"{done:g}" if isinstance(done, int | float) else str(done)
    if isinstance(total, int | float) and total:
        text += f"/{total:g} ({100 * done / total:.0f}%)" if isinstance(done, int | float) else f"/{total:g}"
    return f"{text} {note}" if note else text
