"""The turn records' owner, status and finish-time indexes give way to one partial index on the open records.

Every statement that reads by owner or status asks for open records (``status = 'running'``, or
``awaiting_report``): a turn's open and close, the orphan sweep, the health page's stuck turns. An index on just those
rows stays short whatever the table's size, and a turn writes fewer index entries (its close only removes
its record from this index, where it used to move it in two). Nothing read by ``finished_at`` alone.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("turns_app", "0004_awaiting_report")]

    operations = [
        migrations.RemoveIndex(model_name="turnrecord", name="idx_turn_records_status"),
        migrations.RemoveIndex(model_name="turnrecord", name="idx_turn_records_finished"),
        migrations.RemoveIndex(model_name="turnrecord", name="idx_turn_records_owner"),
        migrations.AddIndex(
            model_name="turnrecord",
            index=models.Index(condition=models.Q(("status", "running"), ("awaiting_report", True), _connector="OR"),
                               fields=["session_id", "owner"], name="idx_turn_records_open")),
    ]
