from django.apps import AppConfig
from django.db.models.signals import post_migrate


class TakeoverAppConfig(AppConfig):
    """Human takeover: a session's mode (bot / waiting / human), operator replies, hand back to an agent."""

    name = "takeover_app"
    verbose_name = "Human takeover"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from takeover_app.groups import grant_takeover_permissions

        post_migrate.connect(grant_takeover_permissions, sender=self, dispatch_uid="takeover_app.groups")
