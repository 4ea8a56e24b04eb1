from django.apps import AppConfig


class AgentsAppConfig(AppConfig):
    """Which agents this site runs (registry from CHATFLOW_AGENTS) and the site's Runner service."""

    name = "agents_app"
    verbose_name = "Agents"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from agents_app import checks  # noqa: F401  (registers the CHATFLOW_AGENTS system check)
