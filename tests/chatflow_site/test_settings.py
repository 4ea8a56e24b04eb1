"""Start-up configuration: malformed values name the variable; production settings pass check --deploy."""

import secrets

import pytest

from tests.processes import run_manage, site_env

pytestmark = pytest.mark.slow

PRODUCTION = {"DEBUG": "0", "SECRET_KEY": secrets.token_urlsafe(50), "ALLOWED_HOSTS": "console.example.com"}


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
        ("CHATFLOW_AGENTS", {"CHATFLOW_AGENTS": "agents_app.no_such_module.build"}),
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
    result = run_manage("check", env=site_env(**overrides))

    assert result.returncode != 0
    assert variable in result.stderr


@pytest.mark.parametrize(("variable", "value", "says"), [
    ("CHATFLOW_HUMAN_AFTER_FAILED_TURNS", "-1", "a whole number of failed turns from 0 to"),
    ("CHATFLOW_TAKEOVER_IDLE_MINUTES", "x", "a whole number of minutes from 0 to 525600"),
    ("CHATFLOW_DEDUP_TTL_HOURS", "99999999999", "a whole number of hours from 1 to 87600"),
])
def test_a_refused_number_says_what_it_counts_and_its_range(variable, value, says):
    result = run_manage("check", env=site_env(**{variable: value}))

    assert result.returncode != 0
    assert f"{variable} must be {says}" in result.stderr


def test_it_never_echoes_a_database_password():
    result = run_manage("check", env=site_env(DATABASE_URL="mysql://user:hunter2@db/chatflow"))

    assert result.returncode != 0
    assert "hunter2" not in result.stderr


def test_it_starts_with_no_configuration_at_all():
    result = run_manage("check", env=site_env())

    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


@pytest.mark.parametrize("value", ["1", "true", "YES", "On"])
def test_it_accepts_the_usual_spellings_of_true(value):
    result = run_manage("check", env=site_env(DEBUG=value))

    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("value", ["0", "False", "no", "OFF"])
def test_it_accepts_the_usual_spellings_of_false(value):
    result = run_manage("check", env=site_env(**{**PRODUCTION, "DEBUG": value}))

    assert result.returncode == 0, result.stderr


def test_check_deploy_is_clean_with_a_production_environment():
    result = run_manage("check", "--deploy", "--fail-level", "DEBUG", env=site_env(**PRODUCTION))

    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_check_deploy_complains_when_debug_is_left_on():
    result = run_manage("check", "--deploy", "--fail-level", "WARNING", env=site_env(DEBUG="1"))

    assert result.returncode != 0
    assert "security.W018" in result.stderr


@pytest.mark.parametrize(("value", "threshold"), [("", "5"), ("on", "5"), ("off", "None")])
def test_postgresql_statements_are_prepared_unless_turned_off(value, threshold):
    env = site_env(DATABASE_URL="postgres://chatflow@127.0.0.1:5432/chatflow", CHATFLOW_PG_PREPARED_STATEMENTS=value)
    result = run_manage("shell", "-c", "from django.conf import settings; "
                        "print(settings.DATABASES['default']['OPTIONS']['prepare_threshold'])", env=env)

    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == threshold
