from django.apps import AppConfig
from django.db.models.signals import post_migrate


class SessionsAppConfig(AppConfig):
    """Django models on the chatflow tables, the Django session store, audited actions, the site's runtime."""

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
        self._register_holdings()

    @staticmethod
    def _register_holdings() -> None:
        """This app's tables and those of the apps below it (which cannot import this one) that hold sessions."""
        from django.core import checks

        from sessions_app import actions, holdings
        from sessions_app.models import OperatorAction, SessionLease, SessionWaiter
        from turns_app import records
        from turns_app.models import SessionTotals, TurnRecord

        checks.register(holdings.check, checks.Tags.models)
        holdings.register(OperatorAction, forget=actions.redact_audit,
                          kept="The audit log says who did what and when, also for a deleted session; the entries' "
                               "texts are redacted.")
        holdings.register(SessionLease, SessionWaiter,
                          kept="A running turn's lock and the turns in line for it: each is released by its turn "
                               "(which the delete stops) or expires.")
        holdings.register(TurnRecord, SessionTotals, forget=records.forget_session,
                          kept="Turn records keep their figures for the metrics and the dashboard, without the "
                               "session id or the customer's text; the totals row is deleted.")
