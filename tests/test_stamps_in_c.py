"""The content check's stats in C (jobtypes/datafiles/_stamps.c): built where tether is installed
here, it says "same" exactly where the check's own Python stats do, on every kind of path, and a
file it finds the same takes no Python stat."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tether.jobtypes.datafiles import existence, fingerprint
from tether.jobtypes.datafiles.durable import Known


def trusted(path: Path) -> str | None:
    """The fingerprint of the file at ``path`` as recorded a second after its last change."""
    st = os.stat(path, follow_symlinks=False)
    return fingerprint.of(Known(st.st_ctime_ns + 1_000_000_000, st))


def wrapped(path: Path) -> str:
    """The fingerprint text of a file whose mtime does not fit in 64 bits, each number cut to its
    low 64 bits (what a C loop that ignored the overflow would make)."""
    st = os.stat(path)
    numbers = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return b"".join((n & (2**64 - 1)).to_bytes(8, "little") for n in numbers).hex()


def cases(root: Path) -> tuple[list[str | None], list[str | None], list[bool]]:
    """Data paths under ``root`` of every kind, their recorded fingerprints and whether each
    stat reads as its fingerprint."""
    (root / "d" / "sub").mkdir(parents=True)
    rels: list[str | None] = []
    recorded: list[str | None] = []
    expected: list[bool] = []

    def case(rel: str | None, known: str | None, same: bool) -> None:
        rels.append(rel)
        recorded.append(known)
        expected.append(same)

    def made(rel: str, body: bytes = b'{"n": 1}\n') -> Path:
        path = root / rel
        path.write_bytes(body)
        return path

    case("d/same.json", trusted(made("d/same.json")), True)
    case("d/sub/same.json", trusted(made("d/sub/same.json")), True)
    case("d/é ü.json", trusted(made("d/é ü.json")), True)  # UTF-8 on disk
    undecodable = os.fsdecode(b"d/\xff.json")  # a name that is not UTF-8 on disk
    case(undecodable, trusted(made(undecodable)), True)
    early = made("d/1969.json")
    os.utime(early, ns=(-1_500_000_001, -1_500_000_001))  # negative times are signed in the text
    case("d/1969.json", trusted(early), True)
    late = made("d/2286.json")
    os.utime(late, (10_000_000_000, 10_000_000_000))  # past 2262: no fingerprint can say it
    assert fingerprint.stamp(os.stat(late)) is None
    case("d/2286.json", wrapped(late), False)
    edited = made("d/edited.json")
    known = trusted(edited)
    st = os.stat(edited)
    edited.write_bytes(b'{"n": 2}\n')  # same size, mtime set back: only the ctime says so
    os.utime(edited, ns=(st.st_atime_ns, st.st_mtime_ns))
    case("d/edited.json", known, False)
    replaced = made("d/replaced.json")
    known = trusted(replaced)
    made("d/replacement.tmp").replace(replaced)  # the same bytes, another inode
    case("d/replaced.json", known, False)
    gone = made("d/gone.json")
    known = trusted(gone)
    gone.unlink()
    case("d/gone.json", known, False)
    target = made("d/target.json")
    (root / "d" / "link.json").symlink_to(target)
    case("d/link.json", trusted(target), False)  # the link itself is looked at, not followed
    (root / "d" / "dir.json").mkdir()
    case("d/dir.json", trusted(made("d/was-a-file.json")), False)
    case("d/unrecorded.json", None, False)
    plain = trusted(made("d/garbled.json"))
    assert plain is not None
    case("d/garbled.json", plain.upper(), False)
    case("d/garbled.json", plain[:-1], False)
    case("d/garbled.json", plain[:-1] + "é", False)
    case(None, plain, False)  # no file to look at
    case("d/nul\x00.json", plain, False)
    case("../outside.json", plain, False)
    return rels, recorded, expected


@pytest.mark.skipif(sys.platform != "linux", reason="built and required where tether's CI runs: Linux")
def test_the_c_module_is_built_where_tether_is_installed() -> None:
    assert fingerprint.matches_in_c is not None, (
        "tether.jobtypes.datafiles._stamps is not built: reinstall tether with a C compiler (make .venv/.installed)"
    )


def test_the_c_module_says_same_exactly_where_the_python_stats_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "data"
    root.mkdir()
    rels, recorded, expected = cases(root)
    with_c = fingerprint.compare(root, rels, recorded)
    monkeypatch.setattr(fingerprint, "matches_in_c", None)
    in_python = fingerprint.compare(root, rels, recorded)
    assert with_c[0] == expected, [rel for rel, a, b in zip(rels, with_c[0], expected, strict=True) if a != b]
    assert in_python == with_c


def test_a_file_the_c_module_finds_the_same_takes_no_python_stat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "data"
    (root / "d").mkdir(parents=True)
    rels = [f"d/{n:02d}.json" for n in range(20)]
    for rel in rels:
        (root / rel).write_text("{}\n")
    recorded = [trusted(root / rel) for rel in rels]
    (root / rels[7]).write_text("[]\n")  # changed since its fingerprint
    statted: list[str] = []
    real = existence.lstat_data_file

    def counting(name: str, dir_fd: int) -> os.stat_result:
        statted.append(name)
        return real(name, dir_fd)

    monkeypatch.setattr(existence, "lstat_data_file", counting)
    same, fresh = fingerprint.compare(root, rels, recorded)
    assert same == [n != 7 for n in range(20)]
    assert statted == ["07.json"]  # only the changed file, whose new fingerprint is made in Python
    assert fresh[7] is None or fresh[7] == trusted(root / rels[7])


@pytest.mark.skipif(fingerprint.matches_in_c is None, reason="the C module is not built (its own test says so)")
def test_the_c_module_refuses_arguments_it_cannot_read() -> None:
    matches = fingerprint.matches_in_c
    assert matches is not None
    fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(ValueError, match="differ in length"):
            matches(fd, ["a"], [])
        with pytest.raises(TypeError, match="not a str"):
            matches(fd, [b"a"], ["0" * 80])  # type: ignore[list-item]  # what is refused
        assert matches(fd, [], []) == []
        assert matches(-1, ["a"], ["0" * 80]) == [False]  # a bad descriptor: not the same
    finally:
        os.close(fd)
