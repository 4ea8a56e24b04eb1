"""Admin for API tokens: create one (its secret is shown once, in the confirmation message), revoke."""

from django.contrib import admin, messages
from django.utils import timezone

from api_app.models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "hint", "created_at", "last_used_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "owner__username", "hint"]
    readonly_fields = ["hint", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def get_fields(self, request, obj=None):
        return ["name", "owner"] + (self.readonly_fields if obj else [])

    def get_readonly_fields(self, request, obj=None):
        return ["owner", *self.readonly_fields] if obj else []

    def save_model(self, request, obj, form, change):
        if not change:
            secret = obj.set_new_secret()
            super().save_model(request, obj, form, change)
            messages.warning(request, f"Token {obj.name!r} created. Its secret is shown only this once, "
                                      f"copy it now: {secret}")
            return
        super().save_model(request, obj, form, change)

    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke(self, request, queryset):
        count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        messages.success(request, f"Revoked {count} token(s).")
