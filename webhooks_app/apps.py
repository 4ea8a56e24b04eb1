from django.apps import AppConfig
from django.db.models.signals import post_migrate


class WebhooksAppConfig(AppConfig):
    """Webhook channels (WhatsApp, Telegram, generic), their inbox/queue and its workers."""

    name = "webhooks_app"
    verbose_name = "Webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from sessions_app import holdings, retention
        from webhooks_app import embedded, settle, taskqueue
        from webhooks_app.groups import grant_ledger_permissions
        from webhooks_app.models import InboundDelivery

        post_migrate.connect(grant_ledger_permissions, sender=self, dispatch_uid="webhooks_app.groups")
        # A turn's commit locks its delivery before the session row: so does the delete.
        holdings.register(InboundDelivery, forget=settle.cancel_deliveries, before_session_row=True,
                          kept="Redacted and settled (cancelled): their provider ids and claims stay so that a "
                               "provider's redelivery is still suppressed as a duplicate.")
        # Retention leaves a session alone while a delivery of it is still to be played.
        retention.register_hold("delivery_in_flight", taskqueue.in_flight)
        embedded.start_if_serving()
