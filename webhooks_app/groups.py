"""Console groups get the ledger's permissions: Operators may view and retry deliveries, Viewers view them.

A post_migrate receiver (after sessions_app's, which creates the groups), so a flush keeps them too.
"""

from __future__ import annotations


def grant_ledger_permissions(sender=None, using: str = "default", apps=None, **kwargs) -> None:
    from django.apps import apps as global_apps
    from django.contrib.auth.management import create_permissions

    apps = apps or global_apps
    try:
        Group = apps.get_model("auth", "Group")
        Permission = apps.get_model("auth", "Permission")
        apps.get_model("webhooks_app", "InboundDelivery")
    except LookupError:
        return
    create_permissions(global_apps.get_app_config("webhooks_app"), verbosity=0, using=using, apps=apps)
    perms = Permission.objects.using(using).filter(content_type__app_label="webhooks_app")
    operators, _ = Group.objects.using(using).get_or_create(name="Operators")
    operators.permissions.add(*perms.filter(codename__in=["view_inbounddelivery", "retry_delivery"]))
    viewers, _ = Group.objects.using(using).get_or_create(name="Viewers")
    viewers.permissions.add(*perms.filter(codename="view_inbounddelivery"))
