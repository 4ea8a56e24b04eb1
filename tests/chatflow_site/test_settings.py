"""Start-up configuration: malformed values name the variable; production settings pass check --deploy.

The settings module is built in-process from a mapping of variables; the tests marked slow start
``manage.py check`` in a process of its own, as a deployment does.
"""

import runpy
import secrets
from typing import Any
from unittest import mock

import environ
import pytest
from django.core.exceptions import ImproperlyConfigured

from tests.processes import REPO, run_manage, site_env

PRODUCTION = {"DEBUG": "0", "SECRET_KEY": secrets.token_urlsafe(50), "ALLOWED_HOSTS": "console.example.com"}


def settings_from(variables: dict[str, str]) -> dict[str, Any]:
    """The names chatflow_site/settings.py defines when the environment holds ``variables`` and nothing else
    (no .env file either); raises what the module raises."""
    with mock.patch.object(environ.Env, "ENVIRON", {"CHATFLOW_ENV_FILE": "", **variables}):
        return runpy.run_path(str(REPO / "chatflow_site" / "settings.py"), run_name="chatflow_site.settings_in_test")


@pytest.mark.parametrize(
    ("variable", "overrides"),
    [
        ("DATABASE_URL", {"DATABASE_URL": "nonsense"}),
        ("DATABASE_URL", {"DATABASE_URL": "mysql://user:secret@db/chatflow"}),
        ("DEBUG", {"DEBUG": "maybe"}),
        ("SECRET_KEY", {"DEBUG": "0", "ALLOWED_HOSTS": "console.example.com"}),
        ("SECRET_KEY", {"DEBUG": "false", "SECRET_KEY": "   "}),
        ("CHATFLOW_MAX_TURNS", {"CHATFLOW_MAX_TURNS": "0"}),
        ("CHATFLOW_MAX_TURNS", {"CHATFLOW_MAX_TURNS": "ten"}),
        ("CHATFLOW_DEDUP_TTL_HOURS", {"CHATFLOW_DEDUP_TTL_HOURS": "-5"}),
        ("CHATFLOW_DEDUP_TTL_HOURS", {"CHATFLOW_DEDUP_TTL_HOURS": "99999999999"}),  # (was a 500 per webhook)
        ("CHATFLOW_LEASE_SECONDS", {"CHATFLOW_LEASE_SECONDS": "99999999999999999999"}),
        ("CHATFLOW_ENGINE", {"CHATFLOW_ENGINE": "gpt"}),
        ("CHATFLOW_MODEL_PRICES", {"CHATFLOW_MODEL_PRICES": "{not json"}),
        ("CHATFLOW_MODEL_PRICES", {"CHATFLOW_MODEL_PRICES": '{"gpt-4o": {"input": "cheap", "output": 1}}'}),
        ("OPENAI_API_KEY", {"CHATFLOW_ENGINE": "openai"}),
        ("REDIS_URL", {"REDIS_URL": "localhost:6379"}),
        ("CHATFLOW_AGENTS", {"CHATFLOW_AGENTS": "not a dotted path"}),
        ("SECURE_SSL_REDIRECT", {**PRODUCTION, "SECURE_SSL_REDIRECT": "sometimes"}),
        ("SECURE_HSTS_SECONDS", {**PRODUCTION, "SECURE_HSTS_SECONDS": "1y"}),
        ("CHATFLOW_WORKER_CPU", {"CHATFLOW_WORKER_CPU": "first"}),
        ("CHATFLOW_WORKER_CPU", {"CHATFLOW_WORKER_CPU": "-1"}),
        ("CHATFLOW_WORKER_NICE", {"CHATFLOW_WORKER_NICE": "20"}),
        ("CHATFLOW_WORKER_NICE", {"CHATFLOW_WORKER_NICE": "-5"}),
        ("CHATFLOW_PG_PREPARED_STATEMENTS", {"CHATFLOW_PG_PREPARED_STATEMENTS": "sometimes"}),
    ],
)
def test_it_refuses_to_start_with_a_bad_value_and_names_the_variable(variable, overrides):
    with pytest.raises(ImproperlyConfigured) as refused:
        settings_from(overrides)

    assert variable in str(refused.value)


@pytest.mark.slow
def test_it_refuses_to_start_with_agents_that_do_not_import():
    result = run_manage("check", env=site_env(CHATFLOW_AGENTS="agents_app.no_such_module.build"))

    assert result.returncode != 0
    assert "CHATFLOW_AGENTS" in result.stderr


@pytest.mark.parametrize(("variable", "value", "says"), [
    ("CHATFLOW_HUMAN_AFTER_FAILED_TURNS", "-1", "a whole number of failed turns from 0 to"),
    ("CHATFLOW_TAKEOVER_IDLE_MINUTES", "x", "a whole number of minutes from 0 to 525600"),
    ("CHATFLOW_DEDUP_TTL_HOURS", "99999999999", "a whole number of hours from 1 to 87600"),
    ("CHATFLOW_BUDGET_TURNS_PER_DAY", "ten", "a whole number of turns from 0 to"),
    ("CHATFLOW_BUDGET_COST_PER_DAY", "-0.5", "an amount of US dollars such as 0.50 (0: no limit)"),
    ("CHATFLOW_BUDGET_ACTION", "block", "one of wait, answer"),
])
def test_a_refused_number_says_what_it_counts_and_its_range(variable, value, says):
    with pytest.raises(ImproperlyConfigured) as refused:
        settings_from({variable: value})

    assert f"{variable} must be {says}" in str(refused.value)


def test_the_daily_budget_is_off_unless_set_and_reads_dollars_as_decimals():
    from decimal import Decimal

    unset = settings_from({})
    assert (unset["CHATFLOW_BUDGET_TURNS_PER_DAY"], unset["CHATFLOW_BUDGET_TOKENS_PER_DAY"],
            unset["CHATFLOW_BUDGET_COST_PER_DAY"], unset["CHATFLOW_BUDGET_ACTION"]) == (0, 0, None, "wait")
    assert settings_from({"CHATFLOW_BUDGET_COST_PER_DAY": "0.50"})["CHATFLOW_BUDGET_COST_PER_DAY"] == Decimal("0.5")
    assert settings_from({"CHATFLOW_BUDGET_COST_PER_DAY": "0"})["CHATFLOW_BUDGET_COST_PER_DAY"] is None


def test_it_never_echoes_a_database_password():
    with pytest.raises(ImproperlyConfigured) as refused:
        settings_from({"DATABASE_URL": "mysql://user:hunter2@db/chatflow"})

    assert "hunter2" not in str(refused.value)


@pytest.mark.slow
def test_it_starts_with_no_configuration_at_all():
    result = run_manage("check", env=site_env())

    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


@pytest.mark.parametrize("value", ["1", "true", "YES", "On"])
def test_it_accepts_the_usual_spellings_of_true(value):
    assert settings_from({"DEBUG": value})["DEBUG"] is True


@pytest.mark.parametrize("value", ["0", "False", "no", "OFF"])
def test_it_accepts_the_usual_spellings_of_false(value):
    assert settings_from({**PRODUCTION, "DEBUG": value})["DEBUG"] is False


@pytest.mark.slow
def test_check_deploy_is_clean_with_a_production_environment():
    result = run_manage("check", "--deploy", "--fail-level", "DEBUG", env=site_env(**PRODUCTION))

    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


@pytest.mark.slow
def test_check_deploy_complains_when_debug_is_left_on():
    result = run_manage("check", "--deploy", "--fail-level", "WARNING", env=site_env(DEBUG="1"))

    assert result.returncode != 0
    assert "security.W018" in result.stderr


@pytest.mark.parametrize(("value", "threshold"), [("", "5"), ("on", "5"), ("off", "None")])
def test_postgresql_statements_are_prepared_unless_turned_off(value, threshold):
    built = settings_from({"DATABASE_URL": "postgres://chatflow@127.0.0.1:5432/chatflow",
                           "CHATFLOW_PG_PREPARED_STATEMENTS": value})

    assert str(built["DATABASES"]["default"]["OPTIONS"]["prepare_threshold"]) == threshold
