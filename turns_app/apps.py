from django.apps import AppConfig


class TurnsAppConfig(AppConfig):
    """Turn records: one row per turn (status, timings, agent trail, model and tool calls, tokens, cost)."""

    name = "turns_app"
    verbose_name = "Turn records"
    default_auto_field = "django.db.models.BigAutoField"
