"""Groups for the console: Operators (every console permission) and Viewers (read only)."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

MODELS = ["chatsession", "chatmessage", "processedmessage", "sessionlease", "operatoraction"]
VIEW = [f"view_{model}" for model in MODELS]
ACTIONS = ["force_handoff", "rollback_session", "delete_session", "export_transcript"]


def create_groups(apps, schema_editor):
    # Permissions are normally created after all migrations (post_migrate); create ours now.
    app_config = apps.get_app_config("sessions_app")
    app_config.models_module = True
    create_permissions(app_config, apps=apps, verbosity=0, using=schema_editor.connection.alias)
    app_config.models_module = None

    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    db = schema_editor.connection.alias
    perms = Permission.objects.using(db).filter(content_type__app_label="sessions_app")
    operators, _ = Group.objects.using(db).get_or_create(name="Operators")
    operators.permissions.add(*perms.filter(codename__in=VIEW + ACTIONS))
    viewers, _ = Group.objects.using(db).get_or_create(name="Viewers")
    viewers.permissions.add(*perms.filter(codename__in=VIEW))


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0003_operator_actions"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_groups, migrations.RunPython.noop)]
