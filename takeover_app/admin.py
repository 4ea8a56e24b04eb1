from django.contrib import admin

from takeover_app.models import OperatorReply, SessionMode


@admin.register(SessionMode)
class SessionModeAdmin(admin.ModelAdmin):
    list_display = ("session_id", "mode", "owner_username", "since", "unread")
    list_filter = ("mode",)
    search_fields = ("session_id", "owner_username")


@admin.register(OperatorReply)
class OperatorReplyAdmin(admin.ModelAdmin):
    list_display = ("id", "session_id", "author_username", "provider", "status", "created_at")
    list_filter = ("status", "provider")
    search_fields = ("session_id", "text")
