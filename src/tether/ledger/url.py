"""The database URL: read and checked before anything connects, and printed without its password.

A URL that cannot name a ledger (it does not parse, its port is no port, its database, driver or
options are ones tether cannot use) is a ``ConfigError`` naming what is wrong, never a driver's
error at the first connection, which a worker would take for an outage and retry.
"""

from __future__ import annotations

import re

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from ..errors import ConfigError

_EXAMPLE = "expected e.g. sqlite:///tether.db"

# The drivers tether runs on: the stdlib's sqlite3, and psycopg 3 (which LISTEN/NOTIFY wake-ups
# also use directly), named or implied by the bare database name.
_DRIVERS = {"sqlite": ("sqlite", "sqlite+pysqlite"), "postgresql": ("postgresql", "postgresql+psycopg")}
_PLAIN = {"sqlite": "sqlite:///", "postgresql": "postgresql://"}

# libpq options whose values are whole numbers (port may list one per host, comma-separated):
# SQLAlchemy or psycopg reads them before connecting and would fail with an error of its own.
_WHOLE_NUMBERS = frozenset(
    ("port", "connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count")
)
_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")

_PASSWORD_PARAMETER = re.compile(r"(?i)([?&]password=)[^&]*")


def mask_url(url: str | sa.URL) -> str:
    """A database URL as it may be printed: its password, and any ``password=`` query value,
    replaced by ``***``. Done on the text, so a mistyped URL that does not parse is masked too:
    everything from the first ``user:`` to the last ``@`` of the authority."""
    text = url.render_as_string(hide_password=False) if isinstance(url, sa.URL) else str(url)
    first_at = text.find("@")
    if first_at >= 0:
        slashes = text.find("//")
        start = slashes + 2 if 0 <= slashes < first_at else 0
        ends = [i for i in (text.find("/", first_at), text.find("?", first_at)) if i >= 0]
        at = text.rfind("@", 0, min(ends, default=len(text)))
        colon = text.find(":", start, at)
        if colon >= 0:
            text = f"{text[: colon + 1]}***{text[at:]}"
    return _PASSWORD_PARAMETER.sub(r"\1***", text)


def parse_url(url: str) -> sa.URL:
    """``url`` parsed; ConfigError (the URL shown with its password masked) when it does not
    parse, names a port outside 1-65535, a database other than SQLite or PostgreSQL, a driver
    other than sqlite3 or psycopg, or a query option its database does not take."""
    shown = mask_url(url)
    try:
        parsed = make_url(url)
    except sa.exc.ArgumentError:
        raise ConfigError(f"not a database URL: {shown!r} ({_EXAMPLE})") from None
    except ValueError:  # SQLAlchemy reads the port with int()
        raise ConfigError(f"not a database URL: {shown!r}: {_authority_problem(shown)}") from None
    backend = parsed.get_backend_name()
    if backend not in _DRIVERS:
        raise ConfigError(f"unsupported database {backend!r} in {shown!r}: use sqlite:/// or postgresql://")
    if parsed.drivername not in _DRIVERS[backend]:
        raise ConfigError(
            f"unsupported driver {parsed.get_driver_name()!r} in {shown!r}: tether uses "
            f"{_DRIVERS[backend][1].partition('+')[2]}: write {_PLAIN[backend]}"
        )
    if "@" in (parsed.host or ""):  # the host is not shown: it holds what follows the password's '@'
        raise ConfigError(f"{shown!r}: an '@' in the user name or password must be written %40")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise ConfigError(f"the port {parsed.port} in {shown!r} is out of range: ports are 1 to 65535")
    if backend == "sqlite":
        if parsed.query:
            raise ConfigError(
                f"{shown!r} has query options ({', '.join(sorted(parsed.query))}); a SQLite ledger's URL "
                "takes none: tether sets its connections' options itself"
            )
    else:
        _check_postgresql(parsed, shown)
    return parsed


def _authority_problem(shown: str) -> str:
    """Why the host and port part of ``shown`` (a masked URL) could not be read."""
    authority = re.split(r"[/?#]", shown.partition("//")[2], maxsplit=1)[0].rpartition("@")[2]
    if authority.startswith("[") and "]" not in authority:
        return "its host opens '[' without closing it (an IPv6 address is written [::1])"
    port = authority.rpartition("]")[2] if authority.startswith("[") else authority
    port = port.partition(":")[2]
    if "," in port:
        return f"its port {port!r} is not a number (several hosts go in the query: ?host=h1:5432&host=h2:5432)"
    return f"its port {port!r} is not a number (ports are 1 to 65535)"


def _check_postgresql(url: sa.URL, shown: str) -> None:
    try:
        from psycopg import pq
    except ImportError as e:  # not installed (no [postgres] extra), or installed without its libpq
        why = "is not installed" if e.name in ("psycopg", None) else f"cannot be imported ({e})"
        raise ConfigError(f"{shown!r} needs psycopg 3, which {why}: pip install 'tether[postgres]'") from None

    known = {option.keyword.decode() for option in pq.Conninfo.get_defaults()}
    unknown = sorted(set(url.query) - known)
    if unknown:
        raise ConfigError(
            f"{shown!r} has unknown connection option(s): {', '.join(unknown)} (PostgreSQL takes libpq's "
            "connection parameters, e.g. sslmode, connect_timeout, application_name)"
        )
    for name, values in url.query.items():
        if not isinstance(values, str) and name not in ("host", "port", "hostaddr"):  # one per host
            raise ConfigError(f"{shown!r}: option {name} is given {len(values)} times; give it once")
        for value in (values,) if isinstance(values, str) else values:
            if name in _WHOLE_NUMBERS and not all(part.strip().isdigit() for part in value.split(",")):
                raise ConfigError(f"{shown!r}: option {name} must be a whole number, not {value!r}")
            if name == "port" and not all(1 <= int(part) <= 65535 for part in value.split(",")):
                raise ConfigError(f"{shown!r}: option port {value!r} is out of range: ports are 1 to 65535")
            if name == "sslmode" and value not in _SSLMODES:
                raise ConfigError(f"{shown!r}: option sslmode must be one of {', '.join(_SSLMODES)}, not {value!r}")
