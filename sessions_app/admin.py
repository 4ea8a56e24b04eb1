"""Admin for the chatflow tables: read-only views of what the runtime wrote.

The one change allowed is deleting a session, and it goes through the console's audited action
(the session store's delete: a running turn gets SessionDeletedError and resurrects nothing), for
users with the console's ``delete_session`` permission.
"""

from django.contrib import admin
from django.db.models import Count

from sessions_app import actions
from sessions_app.access import DELETE
from sessions_app.models import ChatMessage, ChatSession, OperatorAction, ProcessedMessage, SessionLease


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ChatMessageInline(admin.TabularInline):
    model = ChatMessage
    fields = ["id", "role", "content", "created_at"]
    readonly_fields = fields
    ordering = ["id"]
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(ChatSession)
class ChatSessionAdmin(ReadOnlyAdmin):
    list_display = ["session_id", "active_agent_name", "message_count", "created_at", "updated_at"]
    list_filter = ["active_agent_name"]
    search_fields = ["session_id", "metadata"]
    ordering = ["-updated_at"]
    readonly_fields = ["session_id", "active_agent_name", "metadata", "created_at", "updated_at"]
    inlines = [ChatMessageInline]
    show_full_result_count = False

    def has_delete_permission(self, request, obj=None):
        return request.user.has_perm(DELETE)

    def get_deleted_objects(self, objs, request):
        # The confirmation page lists sessions with their message counts, not every message row.
        sessions = []
        for obj in objs:
            n = obj.messages.count()
            sessions.append(f"{obj.session_id} ({n} message{'' if n == 1 else 's'})")
        return sessions, {"chat sessions": len(sessions)}, set(), []

    def delete_model(self, request, obj):
        actions.delete_session(request.user, obj.session_id)

    def delete_queryset(self, request, queryset):
        for session_id in queryset.values_list("session_id", flat=True):
            actions.delete_session(request.user, session_id)

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(_message_count=Count("messages"))

    @admin.display(description="messages", ordering="_message_count")
    def message_count(self, obj):
        return obj._message_count


@admin.register(ChatMessage)
class ChatMessageAdmin(ReadOnlyAdmin):
    list_display = ["id", "session", "role", "content", "created_at"]
    list_filter = ["role"]
    search_fields = ["session__session_id"]
    ordering = ["-id"]
    list_select_related = ["session"]
    show_full_result_count = False


@admin.register(ProcessedMessage)
class ProcessedMessageAdmin(ReadOnlyAdmin):
    list_display = ["message_id", "processed_at"]
    search_fields = ["message_id"]
    ordering = ["-processed_at"]
    show_full_result_count = False


@admin.register(SessionLease)
class SessionLeaseAdmin(ReadOnlyAdmin):
    list_display = ["session_id", "owner", "expires_at"]
    search_fields = ["session_id", "owner"]


@admin.register(OperatorAction)
class OperatorActionAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "actor_username", "action", "session_id"]
    list_filter = ["action"]
    search_fields = ["session_id", "actor_username"]
    date_hierarchy = "created_at"
