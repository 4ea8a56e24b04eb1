from django.contrib import admin

from webhooks_app.models import InboundDelivery


@admin.register(InboundDelivery)
class InboundDeliveryAdmin(admin.ModelAdmin):
    """The webhook inbox, read-only: deliveries are written by the webhooks and the workers only."""

    list_display = ("id", "provider", "provider_message_id", "session_id", "kind", "status", "attempts",
                    "duplicates_suppressed", "first_seen", "last_seen", "reply_status")
    list_filter = ("provider", "status", "kind", "reply_status")
    search_fields = ("provider_message_id", "session_id")
    date_hierarchy = "first_seen"
    ordering = ("-id",)

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
