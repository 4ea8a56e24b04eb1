"""The console's groups: Operators (every console permission) and Viewers (read only).

Created by migration 0004 and again after every ``migrate`` or ``flush`` (post_migrate), so they
exist in a database emptied by a flush — as transactional tests do between tests.
"""

from __future__ import annotations

MODELS = ["chatsession", "chatmessage", "processedmessage", "sessionlease", "operatoraction"]
VIEW = [f"view_{model}" for model in MODELS]
ACTIONS = ["force_handoff", "rollback_session", "delete_session", "export_transcript",
           "add_chatmessage"]  # add_chatmessage: play turns from the live chat page (/chat/)


def ensure_console_groups(sender=None, using: str = "default", apps=None, **kwargs) -> None:
    """post_migrate receiver: create the groups if missing and give them their permissions."""
    from django.apps import apps as global_apps
    from django.contrib.auth.management import create_permissions

    apps = apps or global_apps
    try:
        Group = apps.get_model("auth", "Group")
        Permission = apps.get_model("auth", "Permission")
        apps.get_model("sessions_app", "OperatorAction")
    except LookupError:
        return  # migrating backwards past the models: nothing to do
    create_permissions(global_apps.get_app_config("sessions_app"), verbosity=0, using=using, apps=apps)
    perms = Permission.objects.using(using).filter(content_type__app_label="sessions_app")
    operators, _ = Group.objects.using(using).get_or_create(name="Operators")
    operators.permissions.add(*perms.filter(codename__in=VIEW + ACTIONS))
    viewers, _ = Group.objects.using(using).get_or_create(name="Viewers")
    viewers.permissions.add(*perms.filter(codename__in=VIEW))
