"""Worker heartbeats, queue samples and delivery traces become webhooks_app's models (they were health_app's).

State only: the tables (``chatflow_worker_heartbeats``, ``chatflow_queue_samples``, ``chatflow_delivery_traces``)
stay as they are; health_app's ``0004`` removes the models from its state and keeps a proxy of WorkerHeartbeat for
its permissions. The content types of QueueSample and DeliveryTrace (and so their permissions and any group's
grant of them) move with the models: relabelled, not made again."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

MOVED = ("queuesample", "deliverytrace")


def _relabel(apps, schema_editor, source: str, target: str) -> None:
    content_types = apps.get_model("contenttypes", "ContentType").objects.using(schema_editor.connection.alias)
    for model in MOVED:
        if not content_types.filter(app_label=target, model=model).exists():
            content_types.filter(app_label=source, model=model).update(app_label=target)


def to_webhooks_app(apps, schema_editor) -> None:
    _relabel(apps, schema_editor, "health_app", "webhooks_app")


def to_health_app(apps, schema_editor) -> None:
    _relabel(apps, schema_editor, "webhooks_app", "health_app")


class Migration(migrations.Migration):

    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("health_app", "0003_queue_samples"),
        ("webhooks_app", "0005_reply_held"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="WorkerHeartbeat",
                    fields=[
                        ("owner", models.TextField(help_text="The worker's lease owner (worker:host:pid:…).",
                                                   primary_key=True, serialize=False)),
                        ("host", models.TextField()),
                        ("pid", models.PositiveIntegerField()),
                        ("started_at", models.DateTimeField(default=django.utils.timezone.now)),
                        ("last_beat", models.DateTimeField(default=django.utils.timezone.now)),
                        ("processed", models.PositiveBigIntegerField(default=0,
                                                                     help_text="Deliveries whose turn it played.")),
                    ],
                    options={
                        "db_table": "chatflow_worker_heartbeats",
                        "ordering": ["host", "pid", "owner"],
                        "default_permissions": (),
                    },
                ),
                migrations.CreateModel(
                    name="QueueSample",
                    fields=[
                        ("id", models.BigAutoField(primary_key=True, serialize=False)),
                        ("at", models.DateTimeField(db_index=True, default=django.utils.timezone.now)),
                        ("queued", models.IntegerField(default=0)),
                        ("running", models.IntegerField(default=0)),
                    ],
                    options={"db_table": "chatflow_queue_samples"},
                ),
                migrations.CreateModel(
                    name="DeliveryTrace",
                    fields=[
                        ("delivery", models.OneToOneField(on_delete=django.db.models.deletion.CASCADE,
                                                          primary_key=True, related_name="+", serialize=False,
                                                          to="webhooks_app.inbounddelivery")),
                        ("traceparent", models.CharField(max_length=55)),
                    ],
                    options={"db_table": "chatflow_delivery_traces"},
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(to_webhooks_app, to_health_app),
    ]
