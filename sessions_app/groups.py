"""The console's groups: Operators (every console permission) and Viewers (read only).

Created by migration 0004 and again after every ``migrate`` or ``flush`` (post_migrate), so they
exist in a database emptied by a flush — as transactional tests do between tests.
"""

from __future__ import annotations

from sessions_app.access import CHAT, DELETE, EXPORT, FORCE_HANDOFF, ROLLBACK, codename

MODELS = ["chatsession", "chatmessage", "processedmessage", "sessionlease", "operatoraction"]
VIEW = [f"view_{model}" for model in MODELS]
ACTIONS = [codename(perm) for perm in (FORCE_HANDOFF, ROLLBACK, DELETE, EXPORT, CHAT)]


def grant_console_groups(app_label: str, model: str, operators: list[str], viewers: list[str], *,
                         using: str = "default", apps=None) -> None:
    """Create the Operators and Viewers groups if missing and add ``app_label``'s permissions by codename.

    For post_migrate receivers: nothing happens while ``model`` (``app_label``'s) is not in the
    migration state ``apps`` (migrating backwards past it).
    """
    from django.apps import apps as global_apps
    from django.contrib.auth.management import create_permissions

    apps = apps or global_apps
    try:
        Group = apps.get_model("auth", "Group")
        Permission = apps.get_model("auth", "Permission")
        apps.get_model(app_label, model)
    except LookupError:
        return
    create_permissions(global_apps.get_app_config(app_label), verbosity=0, using=using, apps=apps)
    perms = Permission.objects.using(using).filter(content_type__app_label=app_label)
    for name, codenames in (("Operators", operators), ("Viewers", viewers)):
        group, _ = Group.objects.using(using).get_or_create(name=name)
        group.permissions.add(*perms.filter(codename__in=codenames))


def ensure_console_groups(sender=None, using: str = "default", apps=None, **kwargs) -> None:
    """post_migrate receiver: create the groups if missing and give them their permissions."""
    grant_console_groups("sessions_app", "OperatorAction", VIEW + ACTIONS, VIEW, using=using, apps=apps)
