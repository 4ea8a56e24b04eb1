from django.apps import AppConfig
from django.db.models.signals import post_migrate


class WebhooksAppConfig(AppConfig):
    """Webhook channels (WhatsApp, Telegram, generic), their inbox/queue and its workers."""

    name = "webhooks_app"
    verbose_name = "Webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from webhooks_app import embedded
        from webhooks_app.groups import grant_ledger_permissions

        post_migrate.connect(grant_ledger_permissions, sender=self, dispatch_uid="webhooks_app.groups")
        embedded.start_if_serving()
