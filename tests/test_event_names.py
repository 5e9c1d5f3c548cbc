"""Every event tether logs has a snake_case name, and every status change's event is its edge in
the past tense, each edge its own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tether.ledger.lifecycle import EDGES

SRC = Path(__file__).resolve().parents[1] / "src" / "tether"
SNAKE = re.compile(r"[a-z]+(_[a-z]+)*")


def _emitted() -> dict[str, list[str]]:
    """Event name -> where it is emitted: the first argument of each ``events.emit`` call that is a
    string (``"a" if x else "b"`` counts both)."""
    found: dict[str, list[str]] = {}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("events.emit", "emit") and node.args:
                for name in ast.walk(node.args[0]):
                    if isinstance(name, ast.Constant) and isinstance(name.value, str):
                        found.setdefault(name.value, []).append(f"{path.relative_to(SRC)}:{node.lineno}")
    return found


def test_every_emitted_event_name_is_snake_case():
    emitted = _emitted()
    assert "lost_lease" in emitted and "drift_detected" in emitted  # the walk found the calls
    bad = {name: where for name, where in emitted.items() if not SNAKE.fullmatch(name)}
    assert not bad, f"event names that are not snake_case: {bad}"


def test_each_edge_logs_its_own_event_in_the_past_tense():
    events = [edge.event for edge in EDGES.values()]
    assert len(set(events)) == len(events), "two edges log one event"
    for name, edge in EDGES.items():
        assert SNAKE.fullmatch(edge.event) and "ed" in edge.event, (name, edge.event)
        verb = name.split("_")[-1] if name.startswith("manual_") else name.split("_")[0]
        assert edge.event.replace("manually_", "").startswith(verb.rstrip("ey")), (name, edge.event)


def test_lost_lease_is_logged_in_one_place():
    assert len(_emitted()["lost_lease"]) == 1
