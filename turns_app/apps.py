from django.apps import AppConfig


class TurnsAppConfig(AppConfig):
    """Turn records: one row per turn (status, timings, agent trail, model and tool calls, tokens, cost)."""

    name = "turns_app"
    verbose_name = "Turn records"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from sessions_app.actions import session_deleting
        from turns_app.records import forget_session

        session_deleting.connect(forget_session, dispatch_uid="turns_app.records.forget_session")
