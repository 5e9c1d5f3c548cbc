"""Comments and docstrings in ``src/tether`` give reasons a reader can follow: no issue numbers
(history belongs to the git log), and every file they cite exists in the repository."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "tether"

_ISSUE = re.compile(r"\bissues? #?\d+", re.I)
# A file name as prose cites one: ``worker/loop.py``, docs/design.md; not an attribute (``x.sql``).
_FILE = re.compile(r"(?<![\w./-])([\w-]+(?:/[\w.-]+)*\.(?:py|md|sql|sh|toml))\b")


def prose(path: Path) -> list[tuple[int, str]]:
    """The comments and docstrings of the module at ``path``, each with its first line."""
    text = path.read_text(encoding="utf-8")
    found = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(text).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(text, str(path))):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                found.append((value.lineno, value.value))
    return sorted(found)


def _exists(cited: str, repo: Path, module: Path) -> bool:
    src = repo / "src" / "tether"
    if "/" in cited:
        bases = [repo, src, module.parent, *(p for p in src.iterdir() if p.is_dir())]
        return any((base / cited).exists() for base in bases)
    if (src / cited.replace(".", "/")).with_suffix(".py").exists():
        return True  # a dotted module whose last part looks like a suffix: ledger.sql
    return any(p for p in repo.rglob(cited) if ".venv" not in p.parts and ".git" not in p.parts)


def stale_citations(repo: Path) -> list[str]:
    """``file:line`` and what is wrong, for each issue number and each cited file that is missing."""
    found = []
    for path in sorted((repo / "src" / "tether").rglob("*.py")):
        where = path.relative_to(repo).as_posix()
        for line, text in prose(path):
            found += [f"{where}:{line} cites {m.group(0)!r}" for m in _ISSUE.finditer(text)]
            found += [
                f"{where}:{line} cites {m.group(1)}, which does not exist"
                for m in _FILE.finditer(text)
                if not _exists(m.group(1), repo, path)
            ]
    return found


def test_comments_cite_no_issue_numbers_and_no_missing_files():
    stale = stale_citations(REPO)
    assert not stale, "comments to mend:\n" + "\n".join(stale)


def test_an_issue_number_or_a_missing_file_in_a_comment_is_reported(tmp_path):
    src = tmp_path / "src" / "tether" / "ledger"
    src.mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "design.md").write_text("# design\n")
    (src / "sql.py").write_text(
        '"""Statements (docs/design.md, "Order per target"); see ledger.sql and sql.py."""\n'
        "X = 1  # issue 24: the byte cap\n"
        "def f():\n"
        '    """Written through fs.py\'s atomic write, as DESIGN.md says."""\n'
        "    return 'reports/billing.md'  # a string the code uses is not a citation\n"
    )
    assert stale_citations(tmp_path) == [
        "src/tether/ledger/sql.py:2 cites 'issue 24'",
        "src/tether/ledger/sql.py:4 cites fs.py, which does not exist",
        "src/tether/ledger/sql.py:4 cites DESIGN.md, which does not exist",
    ]
