"""``delete_file``: remove one data file durably."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import PermanentError
from .base import Check, JobType, Payload, Probe
from .datafiles.effects import delete_locked
from .datafiles.existence import file_paths, files_exist
from .datafiles.paths import checked_path
from .target import Target

if TYPE_CHECKING:
    from .context import JobContext


class DeleteFile(Payload):
    """Remove ``path``. A missing file is success unless ``require_exists``."""

    job_type: ClassVar[str] = "delete_file"

    path: str
    require_exists: bool = False


class DeleteFileProbe(Probe):
    """The file is absent (an existence check in either mode: nothing to read)."""

    def check(self, target: str, payload: str, root: Path, *, content: bool) -> Check:
        return self.check_many([(target, payload)], root, content=content)[0]

    def wants_payload(self, *, content: bool) -> bool:
        return False  # the path is in the target (``file:<path>``)

    def check_many(self, items: Sequence[tuple[str, str]], root: Path, *, content: bool) -> list[Check]:
        return files_exist(root, file_paths(items), present=False)


class DeleteFileType(JobType[DeleteFile]):
    name = "delete_file"
    payload_model = DeleteFile
    probe = DeleteFileProbe()

    def prepare(self, payload: DeleteFile, root: Path) -> DeleteFile:
        # Not a ``new_file``: a file on the way means the path cannot exist, which a delete
        # counts as done (as it counts a missing file).
        path = checked_path(self.name, "path", root, payload.path)
        return payload if path == payload.path else payload.model_copy(update={"path": path})

    def target(self, payload: DeleteFile) -> Target:
        return Target.file(payload.path)

    def run(self, payload: DeleteFile, ctx: JobContext) -> dict[str, Any]:
        deleted = delete_locked(ctx, payload.path)
        # On a re-run the file may be gone because an earlier attempt deleted it and crashed
        # before its completion committed: only a first run can tell.
        if not deleted and payload.require_exists and ctx.job.first_run:
            raise PermanentError(f"{payload.path} does not exist and require_exists is true")
        return {"deleted": deleted}
