"""An object's ``_`` attributes belong to it alone: no module of the runtime reads or writes another's."""

from __future__ import annotations

import ast
from pathlib import Path

import chatflow_agent

PACKAGE = Path(chatflow_agent.__file__).parent
OWN = {"self", "cls"}


def foreign_private_accesses(source: str, filename: str = "<source>") -> list[str]:
    """``file:line: expression`` for every ``x._name`` whose ``x`` is not ``self`` or ``cls`` (dunders
    such as ``x.__class__`` excepted)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__") and node.attr.endswith("__"):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in OWN:
            continue
        found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_of_the_runtime_touches_another_objects_private_attributes() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += foreign_private_accesses(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)))
    assert found == []


def test_the_check_finds_a_planted_access_and_lets_own_and_dunder_ones_pass() -> None:
    planted = (
        "class Store:\n"
        "    def delete(self, session):\n"
        "        session._mark_deleted()\n"
        "        self.backend._rules.purge()\n"
        "        return self._sessions, cls._LIMIT, session.__class__, session.store_side\n"
    )
    assert foreign_private_accesses(planted) == [
        "<source>:3: session._mark_deleted",
        "<source>:4: self.backend._rules",
    ]
