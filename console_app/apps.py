from django.apps import AppConfig


class ConsoleAppConfig(AppConfig):
    """The operator console: the session list, the session page, their fragments and consumers, transcript
    export and restore. No models of its own; it composes the panels of the apps below it."""

    name = "console_app"
    verbose_name = "Console"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from console_app.listing import register_flag
        from takeover_app import held
        from webhooks_app import ledger

        # The session list's flags for what the webhook pipeline knows of a session.
        register_flag("failed_delivery", ledger.reply_failed_flag)
        register_flag("turn_failed", ledger.turn_failed_flag)
        # Handed back with customer messages held for an operator unanswered (issue 39).
        register_flag("held_unanswered", held.unanswered_flag)
