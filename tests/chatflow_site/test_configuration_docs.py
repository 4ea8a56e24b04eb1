"""Every environment variable settings.py reads is documented on docs/configuration.md and in .env.example.

The variables are read from settings.py's own syntax tree (``tests.settings_reads``), so a variable added there
is checked without touching this test; the same reading is the list of variables a child process of the tests
starts without (``tests.processes.SITE_VARIABLES``).
"""

from __future__ import annotations

import re

from tests.processes import REPO, SITE_VARIABLES, site_env
from tests.settings_reads import SETTINGS, variables_read

CONFIGURATION_PAGE = REPO / "docs" / "configuration.md"
ENV_EXAMPLE = REPO / ".env.example"
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


def test_a_child_process_starts_from_none_of_the_variables_settings_reads(monkeypatch) -> None:
    read = variables_read(SETTINGS.read_text(encoding="utf-8"))
    for name in read:
        monkeypatch.setenv(name, "from-the-parent")
    assert read <= SITE_VARIABLES
    assert {name for name, value in site_env().items() if value == "from-the-parent"} == set()
