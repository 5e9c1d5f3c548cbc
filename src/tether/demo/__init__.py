"""The sample application and ``make demo`` (``app``), and its AWS part (``aws``).

``python -m tether.demo`` runs the demo; ``tether --import tether.demo`` registers the sample
job types: the names of the old ``tether.demo`` module are imported from ``app`` when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import lazy

if TYPE_CHECKING:
    from .app import (
        DEFAULT_SAMPLE,
        EXTRACTION_PATH,
        FAST_RETRY,
        MARKER,
        ArchiveProject,
        ArchiveProjectType,
        Demo,
        ExistsProbe,
        Person,
        Project,
        PublishReport,
        PublishReportType,
        Requirement,
        RequirementProbe,
        SaveRequirement,
        SaveRequirementType,
        active_jobs,
        json_bytes,
        main,
        person_path,
        project_path,
        register,
        report_path,
        requirement_files,
        requirement_path,
        requirements_on_disk,
        short,
        write_file,
    )

_WHERE = {
    "ArchiveProject": ".app",
    "ArchiveProjectType": ".app",
    "DEFAULT_SAMPLE": ".app",
    "Demo": ".app",
    "EXTRACTION_PATH": ".app",
    "ExistsProbe": ".app",
    "FAST_RETRY": ".app",
    "MARKER": ".app",
    "Person": ".app",
    "Project": ".app",
    "PublishReport": ".app",
    "PublishReportType": ".app",
    "Requirement": ".app",
    "RequirementProbe": ".app",
    "SaveRequirement": ".app",
    "SaveRequirementType": ".app",
    "active_jobs": ".app",
    "json_bytes": ".app",
    "main": ".app",
    "person_path": ".app",
    "project_path": ".app",
    "register": ".app",
    "report_path": ".app",
    "requirement_files": ".app",
    "requirement_path": ".app",
    "requirements_on_disk": ".app",
    "short": ".app",
    "write_file": ".app",
}


__getattr__ = lazy.exports(__name__, _WHERE)


__all__ = [
    "ArchiveProject",
    "ArchiveProjectType",
    "DEFAULT_SAMPLE",
    "Demo",
    "EXTRACTION_PATH",
    "ExistsProbe",
    "FAST_RETRY",
    "MARKER",
    "Person",
    "Project",
    "PublishReport",
    "PublishReportType",
    "Requirement",
    "RequirementProbe",
    "SaveRequirement",
    "SaveRequirementType",
    "active_jobs",
    "json_bytes",
    "main",
    "person_path",
    "project_path",
    "register",
    "report_path",
    "requirement_files",
    "requirement_path",
    "requirements_on_disk",
    "short",
    "write_file",
]
