"""``tether reconcile``: does the data root hold what the ledger says was done?

Exit status as Terraform's ``-detailed-exitcode``: 0 in sync, 2 drift found, 1 could not check.
Any failure (a bad flag, an unreachable database, a crash) exits 1, never 2.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import typer

from .. import config, events
from ..errors import ConfigError
from ..ledger.faults import describe
from .app import JSON_OPTION, Settings, app, err, is_database_error, open_coordinator, out, print_json

if TYPE_CHECKING:
    from rich.progress import Progress

    from ..reconcile.check import Report
    from ..reconcile.plan import Plan


def _reason(error: BaseException) -> str:
    """One line for a failed check: a database error's driver message, else the exception."""
    if is_database_error(error):
        return describe(error)
    return f"{type(error).__name__}: {error}"


_EXISTS_ONLY = typer.Option(
    False,
    "--exists-only",
    help="Only check that files exist or are absent (no file is read): fast, but misses changed bytes.",
)
_FULL = typer.Option(
    False,
    "--full",
    help="Read every file, trusting no fingerprint. Without it a content check reads only the files "
    "whose stat (device, inode, size, mtime, ctime) changed since their bytes were last known, or "
    "that were written within a timestamp tick of it; use --full on a network file system whose "
    "server clock may lag this machine's, or after the system clock was set back.",
)
_UNTRACKED = typer.Option(
    False,
    "--untracked",
    help="Also report files under the root that no job ever named, and AWS resources that carry this "
    "ledger's ownership tag but that no job names (looked for when the ledger holds a sync_aws job, "
    "or with --aws).",
)
_AWS = typer.Option(
    None,
    "--aws/--no-aws",
    help="Check sync_aws resources against AWS (the default when there are any); --aws also looks for "
    "untracked AWS resources on a ledger without sync_aws jobs; --no-aws: report them not_checked and "
    "look for none.",
    show_default=False,
)
_STARTUP = typer.Option(
    False,
    "--startup",
    help="Reclaim stale locks first (Coordinator.startup_check): what to run before workers start. "
    "Without it the check changes nothing (it records only its verdict).",
)
_QUIET = typer.Option(
    False,
    "--quiet",
    "-q",
    help="Do not print events (drift_detected, reconcile_finished: JSON lines on stderr; "
    "never on a terminal, where the report already lists every finding).",
)
_PLAN = typer.Option(
    False,
    "--plan",
    help="Also propose, per finding, the job that restores the ledger's state (or why none can): "
    "a table, or JSON with --json. Enqueues nothing: approve it with `tether repair apply`.",
)
_OUT = typer.Option(None, "--out", help="With --plan: write the plan (JSON) to this file for `tether repair apply`.")
_DB = typer.Option(None, "--db", help="Ledger URL (same as the global --db / TETHER_DB).")
_ROOT = typer.Option(None, "--root", help="Data root (same as the global --root / TETHER_ROOT).")


@app.command()
def reconcile(
    ctx: typer.Context,
    as_json: bool = JSON_OPTION,
    exists_only: bool = _EXISTS_ONLY,
    full: bool = _FULL,
    untracked: bool = _UNTRACKED,
    aws: bool | None = _AWS,
    startup: bool = _STARTUP,
    quiet: bool = _QUIET,
    plan: bool = _PLAN,
    out_file: Path | None = _OUT,
    db: str | None = _DB,
    root: str | None = _ROOT,
) -> None:
    """Compare the ledger with the data root and report drift; never repairs anything.

    For each path the expectation is the effect of the latest completed create_file/delete_file
    job; paths with a pending or claimed job are not checked. Exit 0 in sync, 2 drift, 1 could
    not check.

    Example: tether --db sqlite:///ledger/tether.db --root ./data reconcile --json

    Example: tether reconcile --plan --out plan.json && tether repair apply plan.json
    """
    try:
        # Its own --db and --root (as the check script takes them) stand for the global ones.
        settings = replace(ctx.obj, db=ctx.obj.db if db is None else db, root=ctx.obj.root if root is None else root)
        if full and exists_only:
            raise ConfigError("--full reads every file and --exists-only reads none: give one of them")
        _require_existing(settings)
        options: dict[str, Any] = {"content": not exists_only, "full": full, "untracked": untracked, "aws": aws}
        options["plan"] = plan or out_file is not None
        report, proposed = _check(settings, options, startup=startup, quiet=quiet, as_json=as_json)
        if proposed is not None:
            _show_plan(report, proposed, out_file, as_json=as_json)
        elif as_json:
            print_json(report.to_dict())
        else:
            _print(report)
    except KeyboardInterrupt:
        err.print("tether reconcile: interrupted; nothing was checked to the end")
        sys.exit(130)
    except Exception as e:  # a crash must never read as drift (exit 2)
        err.print(f"tether: error: could not check: {_reason(e)}", markup=False, soft_wrap=True)
        sys.exit(1)
    # sys.exit, not typer.Exit: the console entry runs typer without standalone mode, where an
    # Exit code is returned to it rather than raised.
    sys.exit(report.exit_code)


def _check(
    settings: Settings, options: dict[str, Any], *, startup: bool, quiet: bool, as_json: bool
) -> tuple[Report, Plan | None]:
    """The check itself, with ``options`` for ``reconcile`` (or ``startup_check``, which first
    reclaims stale locks), and its repair plan when ``options["plan"]``."""
    from ..reconcile.check import reconcile as run_reconcile

    # Events are for a log (stderr redirected, the journal); a person at a terminal reads the
    # report, which lists every finding already.
    with events.to_stderr(not quiet and not err.is_terminal), open_coordinator(settings) as coordinator:
        with _progress(coordinator, enabled=not as_json and err.is_terminal) as progress:
            planning = options.pop("plan", False)
            options = {**options, "progress": progress}
            report = coordinator.startup_check(**options) if startup else run_reconcile(coordinator, **options)
        return report, coordinator.plan_repairs(report) if planning else None


def _require_existing(settings: Settings) -> None:
    """A check never creates what it checks: a mistyped --db would otherwise be a new, empty
    ledger reading "in sync", and a mistyped --root an empty directory reading "missing"."""
    from ..observe.readonly import open_ledger

    open_ledger(settings.db, schema=settings.schema).dispose()
    named = config.named_root(settings.root)
    if named is None:
        return  # the ledger's recorded root: opening the ledger checks it exists
    path = Path(named)
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        raise ConfigError(f"the data root {path} {what} (check --root or TETHER_ROOT)")


class _progress:
    """A rich progress bar on stderr for long checks; a no-op when not on a terminal."""

    def __init__(self, coordinator: Any, *, enabled: bool) -> None:
        self.coordinator, self.enabled = coordinator, enabled
        self.bar: Progress | None = None

    def __enter__(self) -> Callable[[int], None] | None:
        if not self.enabled:
            return None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from ..reconcile.check import count_targeted

        total = count_targeted(self.coordinator)
        self.bar = Progress(
            TextColumn("reconciling targets"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            transient=True,
        )
        self.bar.start()
        task = self.bar.add_task("reconcile", total=total)
        bar = self.bar
        return lambda done: bar.update(task, completed=done)

    def __exit__(self, *_: object) -> None:
        if self.bar is not None:
            self.bar.stop()


def _print(report: Report) -> None:
    from rich.table import Table

    from ..reconcile.check import DRIFT, STATUSES

    counts = ", ".join(f"{report.counts[s]} {s}" for s in STATUSES if report.counts[s] or s == "in_sync")
    newest = report.newest_job_id or "none"
    mode = ("content, every file read" if report.full else "content") if report.content else "existence only"
    out.print(
        f"checked {report.checked} path(s) at {report.checked_at.isoformat()} ({mode}; newest job {newest}): {counts}"
    )
    if report.findings:
        table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
        for column in ("status", "path", "job", "expected", "actual"):
            wrap = column in ("path", "actual")
            table.add_column(
                column, overflow="fold" if wrap else "ellipsis", no_wrap=not wrap, ratio=1 if wrap else None
            )
        for f in report.findings:
            style = "red" if f.status in DRIFT else "yellow" if f.status == "unknown" else None
            expected, actual = _bytes(f.expected_size, f.expected_sha256), _bytes(f.actual_size, f.actual_sha256)
            if f.differences and f.expected_size is None:  # not a file: say which fields differ
                expected = "; ".join(f"{d.path}={_value(d.expected)}" for d in f.differences)
                actual = "; ".join(f"{d.path}={_value(d.actual)}" for d in f.differences)
            if f.detail and f.status in ("unknown", "modified", "not_checked", "missing"):
                actual = f.detail if actual == "-" else f"{actual} ({f.detail})"
            table.add_row(f.status, f.path, f.job_id or "-", expected, actual, style=style)
        out.print(table)
    if report.ignored:
        from .plan_table import print_ignored

        print_ignored((f.path, f.status, rule) for f, rule in report.ignored)
    verdict = {0: "in sync", 1: "could not check every path", 2: f"drift found ({report.drift})"}[report.exit_code]
    if report.exit_code == 0 and report.counts["not_checked"]:
        verdict = f"in sync where checked; {report.counts['not_checked']} not checked (see the table)"
    out.print(verdict)


def _show_plan(report: Report, plan: Plan, out_file: Path | None, *, as_json: bool) -> None:
    """The plan as JSON or a table (target, finding, the job it would enqueue); written to
    ``out_file`` too when given."""
    if out_file is not None:
        out_file.write_bytes(plan.to_json() + b"\n")
    if as_json:
        print_json({**plan.to_dict(), "exit_code": report.exit_code, "ignored": len(report.ignored)})
        return
    from .plan_table import print_plan

    print_plan(plan, report, out_file)


def _value(value: Any) -> str:
    """A differing field's value, short: JSON, cut at 40 characters; absent as ``-``."""
    if value is None:
        return "-"
    text = orjson.dumps(value, default=str).decode()
    return text if len(text) <= 40 else text[:39] + "…"


def _bytes(size: int | None, sha256: str | None) -> str:
    if size is None and sha256 is None:
        return "-"
    parts = [f"{size} B" if size is not None else "", sha256[:8] if sha256 else ""]
    return " ".join(p for p in parts if p)


def _check_command() -> Any:
    """``reconcile`` as a command of its own (``Usage: tether-reconcile-check [OPTIONS]``) that also
    takes tether's global options but --db and --root, which it has: --import, --schema, ..."""
    group = typer.main.get_command(app)
    command = group.commands["reconcile"]  # type: ignore[attr-defined]
    own = {p.name for p in command.params}
    shared = [p for p in group.params if p.name not in own]
    names = [p.name for p in shared if p.name]  # typer names every option; the type allows None

    def run(**values: Any) -> Any:
        assert group.callback is not None and command.callback is not None  # both are typer commands
        group.callback(db=values["db"], root=values["root"], **{name: values.pop(name) for name in names})
        return command.callback(**values)

    return type(command)(
        "tether-reconcile-check",
        callback=run,
        params=[*command.params, *shared],
        help=command.help,
        rich_markup_mode=None,
    )


def check_main(argv: list[str] | None = None) -> None:
    """Entry of ``bin/tether-reconcile-check``: ``tether reconcile`` in which every failure, a usage error
    included, exits 1 (click's usage errors exit 2, which here would read as drift)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        rv = _check_command().main(args, prog_name="tether-reconcile-check", standalone_mode=False)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.TyperException as e:  # usage errors (typer's own click)
        show = getattr(e, "show", None)
        if show is not None:
            show()
        else:
            err.print(f"tether-reconcile-check: {e}", markup=False)
        sys.exit(1)
    except Exception as e:
        err.print(f"tether-reconcile-check: could not check: {_reason(e)}", markup=False, soft_wrap=True)
        sys.exit(1)
    sys.exit(rv if isinstance(rv, int) else 0)
