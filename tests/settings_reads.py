"""The environment variables settings.py reads, found in its own syntax tree: the first argument of each
``env.<method>(...)``, ``os.environ``/``os.getenv`` call, and of each call to a settings helper whose first
parameter is ``name`` (``_bool("DEBUG", ...)``). The one list of them: the configuration page's test and the
child processes' environment (``tests.processes``) both read it here."""

from __future__ import annotations

import ast
from pathlib import Path

SETTINGS = Path(__file__).resolve().parent.parent / "chatflow_site" / "settings.py"
NOT_A_VARIABLE = {"read_env", "db_url_config"}  # env methods whose first argument is a path or a URL


def _is_env_read(func: ast.expr, helpers: set[str]) -> bool:
    if isinstance(func, ast.Name):
        return func.id in helpers or func.id == "getenv"
    if isinstance(func, ast.Attribute):
        owner = func.value
        if isinstance(owner, ast.Name) and owner.id == "env":  # env.str(...), env.bool(...), ...
            return func.attr not in NOT_A_VARIABLE
        if isinstance(owner, ast.Name) and owner.id == "os" and func.attr == "getenv":
            return True
        if isinstance(owner, ast.Attribute) and owner.attr == "environ" and func.attr == "get":
            return True
    return False


def variables_read(source: str) -> set[str]:
    """The environment variables a settings module reads (string constants only)."""
    tree = ast.parse(source)
    helpers = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)
               and node.args.args and node.args.args[0].arg == "name"}
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and _is_env_read(node.func, helpers):
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.add(first.value)
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "environ" and isinstance(node.slice, ast.Constant):
            found.add(node.slice.value)
    return found
