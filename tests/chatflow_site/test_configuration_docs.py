"""Every environment variable settings.py reads is documented on docs/configuration.md and in .env.example.

The variables are read from settings.py's own syntax tree: the first argument of each ``env.<method>(...)``,
``os.environ``/``os.getenv`` call, and of each call to a settings helper whose first parameter is ``name``
(``_bool("DEBUG", ...)``), so a variable added there is checked without touching this test.
"""

from __future__ import annotations

import ast
import re

from tests.processes import REPO

SETTINGS = REPO / "chatflow_site" / "settings.py"
CONFIGURATION_PAGE = REPO / "docs" / "configuration.md"
ENV_EXAMPLE = REPO / ".env.example"
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


def documented_on_the_page(text: str) -> set[str]:
    """Variables named in the first column of the page's tables."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| ---"):
            names |= set(re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split("|")[1]))
    return names


def listed_in_env_example(text: str) -> set[str]:
    """Variables given a line of their own, set (``NAME=``) or shown commented out (``# NAME=``)."""
    return set(re.findall(r"(?m)^(?:#\s*)?([A-Z][A-Z0-9_]+)=", text))


def test_the_reader_finds_the_variables_settings_reads() -> None:
    read = variables_read(SETTINGS.read_text(encoding="utf-8"))
    assert {"DEBUG", "SECRET_KEY", "DATABASE_URL", "REDIS_URL", "CHATFLOW_ENV_FILE", "CHATFLOW_LEASE_SECONDS",
            "CHATFLOW_MODEL_PRICES", "CHATFLOW_HUMAN_PHRASES", "OTEL_EXPORTER_OTLP_ENDPOINT"} <= read
    assert len(read) > 40


def test_the_reader_sees_every_way_settings_could_read_a_variable() -> None:
    source = '''
import os
env = None
def _flag(name, default): ...
def _other(value, name): ...
A = env.str("ONE", default="")
B = env.bool("TWO")
C = _flag("THREE", True)
D = os.environ.get("FOUR")
E = os.getenv("FIVE")
F = os.environ["SIX"]
G = _other("NOT_A_NAME", "x")
env.read_env("/path/.env")
H = env.db_url_config("sqlite:///x")
'''
    assert variables_read(source) == {"ONE", "TWO", "THREE", "FOUR", "FIVE", "SIX"}


def test_every_variable_settings_reads_is_on_the_configuration_page() -> None:
    missing = variables_read(SETTINGS.read_text(encoding="utf-8")) - documented_on_the_page(
        CONFIGURATION_PAGE.read_text(encoding="utf-8"))
    assert missing == set(), f"add a row for each to {CONFIGURATION_PAGE.relative_to(REPO)}"


def test_every_variable_settings_reads_is_in_env_example() -> None:
    missing = variables_read(SETTINGS.read_text(encoding="utf-8")) - listed_in_env_example(
        ENV_EXAMPLE.read_text(encoding="utf-8"))
    assert missing == set(), "add a NAME= line (or '# NAME=' for one not to set) for each to .env.example"


def test_the_page_and_env_example_name_no_variable_settings_does_not_read() -> None:
    read = variables_read(SETTINGS.read_text(encoding="utf-8"))
    assert listed_in_env_example(ENV_EXAMPLE.read_text(encoding="utf-8")) - read == set()
    assert documented_on_the_page(CONFIGURATION_PAGE.read_text(encoding="utf-8")) - read == set()
