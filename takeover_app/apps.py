from django.apps import AppConfig
from django.db.models.signals import post_migrate


class TakeoverAppConfig(AppConfig):
    """Human takeover: a session's mode (bot / waiting / human), operator replies, hand back to an agent."""

    name = "takeover_app"
    verbose_name = "Human takeover"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from sessions_app import holdings, retention, runtime
        from takeover_app import gate, service
        from takeover_app.groups import grant_takeover_permissions
        from takeover_app.models import OperatorReply, SessionMode
        from webhooks_app import policy

        post_migrate.connect(grant_takeover_permissions, sender=self, dispatch_uid="takeover_app.groups")
        runtime.add_runner_hook(gate.install)
        policy.install(gate.POLICY)  # what a webhook delivery's turn asks: held sessions, failed turns
        # A turn's commit writes the mode row before the session row: so does the delete. A deleted session's
        # mode (its owner, its notes) and its operators' replies go with it.
        holdings.register(SessionMode, before_session_row=True)
        holdings.register(OperatorReply)
        # Retention leaves a session alone while an operator has it or is asked for.
        retention.register_hold("takeover", service.in_takeover)
