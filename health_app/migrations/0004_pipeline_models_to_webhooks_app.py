"""Worker heartbeats, queue samples and delivery traces are webhooks_app's models now (its ``0006``): state only, the
tables stay. WorkerHeartbeat stays here as a proxy, so its permissions keep their names and rows
(``health_app.cancel_turn``, ``health_app.view_workerheartbeat``)."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("health_app", "0003_queue_samples"),
        ("webhooks_app", "0006_pipeline_instrumentation"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="DeliveryTrace"),
                migrations.DeleteModel(name="QueueSample"),
                migrations.DeleteModel(name="WorkerHeartbeat"),
                migrations.CreateModel(
                    name="WorkerHeartbeat",
                    fields=[],
                    options={
                        "permissions": [("cancel_turn", "Can cancel a running turn or release a stale session lease")],
                        "proxy": True,
                        "indexes": [],
                        "constraints": [],
                    },
                    bases=("webhooks_app.workerheartbeat",),
                ),
            ],
            database_operations=[],
        ),
    ]
