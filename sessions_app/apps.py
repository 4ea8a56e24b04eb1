from django.apps import AppConfig
from django.db.models.signals import post_migrate


class SessionsAppConfig(AppConfig):
    """Django models on the chatflow tables, the Django session store and the operator console."""

    name = "sessions_app"
    verbose_name = "Chat sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from sessions_app.groups import ensure_console_groups

        post_migrate.connect(ensure_console_groups, sender=self, dispatch_uid="sessions_app.console_groups")
        # Operator actions are broadcast live once their transaction commits (invariant 10).
        from django.db.models.signals import post_save

        from sessions_app.live import on_operator_action

        post_save.connect(on_operator_action, sender="sessions_app.OperatorAction", dispatch_uid="sessions_app.live")
        # A login lockout (django-axes) is written to the audit log.
        from axes.signals import user_locked_out

        from sessions_app.lockouts import audit_lockout

        user_locked_out.connect(audit_lockout, dispatch_uid="sessions_app.lockouts")
