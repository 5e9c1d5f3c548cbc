"""``remove_temp``: remove one temp file an interrupted write left (a repair plan's answer to a
``leftover_temp`` finding). It holds the lock of the data file the temp file was written for, so
no live write of that file owns the temp file it removes. It has no target: the data file's own
jobs keep deciding its check, and the next check's walk shows the temp file gone.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from .base import JobType, Payload
from .datafiles import durable, locks
from .datafiles.paths import TEMP_SUFFIX, checked_path

if TYPE_CHECKING:
    from .context import JobContext

_TEMP_NAME = re.compile(r"^\.(?P<target>.+)\.[0-9a-f]{8}" + re.escape(TEMP_SUFFIX) + "$")


class RemoveTemp(Payload):
    """Remove the temp file ``path`` (``<dir>/.<name>.<8 hex>.tether-tmp``)."""

    job_type: ClassVar[str] = "remove_temp"

    path: str


def data_file_of(temp: str) -> str | None:
    """The data file a temp file's name says it was written for; None if it is not one."""
    directory, _, name = temp.rpartition("/")
    match = _TEMP_NAME.match(name)
    if match is None:
        return None
    return f"{directory}/{match['target']}" if directory else match["target"]


class RemoveTempType(JobType[RemoveTemp]):
    name = "remove_temp"
    payload_model = RemoveTemp

    def prepare(self, payload: RemoveTemp, root: Path) -> RemoveTemp:
        from ..errors import InvalidPayload

        target = data_file_of(payload.path)
        if target is None:
            raise InvalidPayload(
                self.name, [f"path: {payload.path!r} is not a tether temp file (.<name>.<8 hex>{TEMP_SUFFIX})"]
            )
        target = checked_path(self.name, "path", root, target)  # the data file's path must be safe
        directory = target.rpartition("/")[0]
        name = payload.path.rpartition("/")[2]
        path = f"{directory}/{name}" if directory else name
        return payload if path == payload.path else payload.model_copy(update={"path": path})

    def run(self, payload: RemoveTemp, ctx: JobContext) -> dict[str, Any]:
        target = data_file_of(payload.path)
        assert target is not None  # prepare checked it
        with (
            durable.opened_root(ctx.root) as root_fd,
            locks.path_lock(ctx.root, target, root_fd=root_fd),
            durable.data_file(ctx.root, payload.path, root_fd=root_fd) as f,
        ):
            return {"removed": f.delete()}
