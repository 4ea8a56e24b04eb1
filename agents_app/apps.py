from django.apps import AppConfig


class AgentsAppConfig(AppConfig):
    """Which agents this site runs (registry from CHATFLOW_AGENTS) and the site's Runner service."""

    name = "agents_app"
    verbose_name = "Agents"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from agents_app import checks  # noqa: F401  (registers the CHATFLOW_AGENTS system check)
        from sessions_app.live import publisher, warn_unless_serving
        from sessions_app.runtime import add_runner_hook, subscribe

        subscribe(publisher)  # the site's Runner publishes every run event to the channel layer
        add_runner_hook(warn_unless_serving)  # a second process on the in-memory layer warns
