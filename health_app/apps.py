from django.apps import AppConfig
from django.db.models.signals import post_migrate


class HealthAppConfig(AppConfig):
    """The health page (queue, stuck turns, leases, failures, workers), /metrics and OpenTelemetry traces."""

    name = "health_app"
    verbose_name = "Health"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from health_app.groups import grant_health_permissions
        from webhooks_app import tracing

        post_migrate.connect(grant_health_permissions, sender=self, dispatch_uid="health_app.groups")
        tracing.configure_from_settings()
