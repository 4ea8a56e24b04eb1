"""Layering rules that hold for the whole tree (ARCHITECTURE.md › Layers)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Production code outside the runtime: the Django site and its apps, the benchmarks, the entry points.
OUTSIDE_THE_RUNTIME = ["agents_app", "api_app", "chatflow_site", "console_app", "health_app", "search_app",
                       "sessions_app", "takeover_app", "turns_app", "webhooks_app", "bench", "manage.py", "dev.py"]


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            # ``from chatflow_agent.core import _persistent`` imports a private module too
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _private_runtime_module(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "chatflow_agent" and any(p.startswith("_") and not p.startswith("__") for p in parts[1:])


def _production_files() -> list[Path]:
    files: list[Path] = []
    for entry in OUTSIDE_THE_RUNTIME:
        path = REPO / entry
        files += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return files


def test_nothing_outside_the_runtime_imports_its_private_modules() -> None:
    files = _production_files()
    assert len(files) > 50  # the walk found the apps
    offenders = [f"{path.relative_to(REPO)}:{line}: {name}"
                 for path in files for line, name in _imported_modules(path) if _private_runtime_module(name)]
    assert offenders == []


def test_the_check_recognises_private_runtime_imports() -> None:
    assert _private_runtime_module("chatflow_agent.core._persistent")
    assert _private_runtime_module("chatflow_agent._jsonsafe")
    assert not _private_runtime_module("chatflow_agent.core.backend")
    assert not _private_runtime_module("chatflow_agent.__version__")
    assert not _private_runtime_module("sessions_app._private")


# --- One direction for the apps ----------------------------------------------------------------------------------
#: The project's apps from the top of the stack to the bottom, written once: a module imports only modules of its own
#: app and of apps below it (README › Architecture). ``chatflow_site`` is the composition root, ``chatflow_agent`` the
#: framework-free runtime every app stands on.
STACK = ["chatflow_site", "health_app", "api_app", "agents_app", "console_app", "takeover_app", "webhooks_app",
         "search_app", "sessions_app", "turns_app", "chatflow_agent"]
#: The Django apps whose every module the import checks read (the runtime has tests of its own).
DJANGO_APPS = STACK[:-1]
#: An app module imports another app module inside a function only where the import at module level would close an
#: import cycle, and says which on the import's line or the line above. Exempt: the functions of ``apps.py`` (an
#: ``AppConfig`` module is imported before any model is loaded; its ``ready()`` is where Django has an app import its
#: models and connect signals), and imports of the runtime (``chatflow_agent`` loads engines and their SDKs lazily).
CYCLE_MARKER = "# import cycle: "


@dataclass(frozen=True)
class ImportLine:
    """One project import: ``importer`` imports ``target`` (a module path, longest known prefix) at ``line``."""

    importer: str
    target: str
    line: int
    in_function: bool
    marked: bool
    in_app_config: bool
    type_checking: bool


def app_modules(root: Path, apps: list[str]) -> dict[str, Path]:
    """Every ``.py`` module of ``apps`` under ``root``, by dotted name (a package by its own name)."""
    modules: dict[str, Path] = {}
    for app in apps:
        for path in sorted((root / app).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: dict[str, Path], stack: list[str]) -> str | None:
    """The longest known module ``name`` starts with; an app outside the scanned ones (the runtime) by its name."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return parts[0] if parts[0] in stack else None


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _marked(lines: list[str], lineno: int) -> bool:
    """The import at ``lineno`` gives its reason (``# import cycle: …``) on its line or the line above."""
    return any(CYCLE_MARKER in lines[i - 1] and lines[i - 1].split(CYCLE_MARKER, 1)[1].strip()
               for i in (lineno, lineno - 1) if i >= 1)


def _module_imports(importer: str, path: Path, modules: dict[str, Path], stack: list[str]) -> list[ImportLine]:
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    found: list[ImportLine] = []

    def visit(node: ast.AST, function: str | None, type_checking: bool) -> None:
        for child in ast.iter_child_nodes(node):
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                names = [f"{child.module}.{alias.name}" for alias in child.names]
            for name in names:
                target = _resolve(name, modules, stack)
                if target is not None and target != importer:
                    found.append(ImportLine(importer, target, child.lineno, function is not None,
                                            _marked(lines, child.lineno), path.name == "apps.py", type_checking))
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(child, function or getattr(child, "name", "lambda"), type_checking)
            elif isinstance(child, ast.If) and _is_type_checking(child):
                visit(child, function, True)
            else:
                visit(child, function, type_checking)

    visit(ast.parse(source, filename=str(path)), None, False)
    return found


def project_imports(root: Path, stack: list[str], apps: list[str]) -> list[ImportLine]:
    """Every import of a project module in every module of ``apps``: ``import x``, ``from x import y`` (``y`` a
    module or a name in ``x``), at module level, under ``if TYPE_CHECKING:`` and inside functions."""
    modules = app_modules(root, apps)
    return [found for importer, path in modules.items() for found in _module_imports(importer, path, modules, stack)]


def _app(module: str) -> str:
    return module.split(".")[0]


def upward_imports(imports: list[ImportLine], stack: list[str]) -> list[ImportLine]:
    """The imports whose target's app sits above the importer's app in ``stack``."""
    return [i for i in imports if stack.index(_app(i.target)) < stack.index(_app(i.importer))]


def module_cycles(imports: list[ImportLine]) -> list[list[str]]:
    """The import cycles among modules at import time (module-level imports, not under ``TYPE_CHECKING``): each a
    strongly connected component of two or more modules, sorted."""
    graph: dict[str, set[str]] = {}
    for i in imports:
        if not i.in_function and not i.type_checking:
            graph.setdefault(i.importer, set()).add(i.target)
            graph.setdefault(i.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(cycles)


def unmarked_function_imports(imports: list[ImportLine], apps: list[str]) -> list[ImportLine]:
    """Imports of modules of ``apps`` inside functions (outside ``apps.py``) without a ``# import cycle: <reason>``
    marker."""
    return [i for i in imports
            if i.in_function and not i.in_app_config and not i.marked and _app(i.target) in apps]


def _shown(imports: list[ImportLine]) -> list[str]:
    return sorted({f"{i.importer}:{i.line} imports {i.target}" for i in imports})


def test_every_app_imports_only_apps_below_it() -> None:
    imports = project_imports(REPO, STACK, DJANGO_APPS)
    assert len({i.importer for i in imports}) > 80  # the walk found the apps
    assert {_app(i.importer) for i in imports} == set(DJANGO_APPS)
    assert _shown(upward_imports(imports, STACK)) == []


def test_no_module_imports_itself_through_a_cycle() -> None:
    assert module_cycles(project_imports(REPO, STACK, DJANGO_APPS)) == []


def test_imports_inside_functions_say_which_cycle_they_break() -> None:
    assert _shown(unmarked_function_imports(project_imports(REPO, STACK, DJANGO_APPS), DJANGO_APPS)) == []


def _plant(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


TINY_STACK = ["top_app", "low_app", "chatflow_agent"]


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    _plant(tmp_path, {
        "top_app/__init__.py": "", "top_app/views.py": "from low_app import store\nfrom chatflow_agent import Agent\n",
        "low_app/__init__.py": "", "low_app/store.py": "import os\n",
        "low_app/models.py": "def f():\n    from top_app import views  # import cycle: planted\n",
        "low_app/admin.py": "from top_app.views import anything\n",
    })
    imports = project_imports(tmp_path, TINY_STACK, TINY_STACK[:-1])
    assert _shown(upward_imports(imports, TINY_STACK)) == ["low_app.admin:1 imports top_app.views",
                                                           "low_app.models:2 imports top_app.views"]
    assert _shown(upward_imports(imports, ["low_app", "top_app", "chatflow_agent"])) == [
        "top_app.views:1 imports low_app.store"]


def test_the_check_sees_a_cycle_and_an_unmarked_import_in_a_function(tmp_path: Path) -> None:
    _plant(tmp_path, {
        "low_app/__init__.py": "", "low_app/a.py": "from low_app import b\n", "low_app/b.py": "import low_app.c\n",
        "low_app/c.py": "from low_app.a import x\n",
        "low_app/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from low_app import e\n",
        "low_app/e.py": "from low_app import d\n\ndef later():\n    from low_app import a\n\n"
                        "def reasoned():\n    # import cycle: planted\n    from low_app import b\n",
        "low_app/apps.py": "class C:\n    def ready(self):\n        from low_app import a\n",
    })
    imports = project_imports(tmp_path, TINY_STACK, ["low_app"])
    assert module_cycles(imports) == [["low_app.a", "low_app.b", "low_app.c"]]  # d ↔ e only under TYPE_CHECKING
    assert _shown(unmarked_function_imports(imports, ["low_app"])) == ["low_app.e:4 imports low_app.a"]
