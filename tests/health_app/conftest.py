"""The webhook tests' settings (provider secrets, a fresh site store per test) apply here too."""

from tests.webhooks_app.conftest import webhook_settings  # noqa: F401 - an autouse fixture
