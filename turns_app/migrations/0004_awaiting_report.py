"""A cancelled record waiting for its turn's figures is flagged ``awaiting_report`` (it was recognised by its
error text), with a partial index for the lease purge that counts the ones whose figures never came."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("turns_app", "0003_folded_records")]

    operations = [
        migrations.AddField(
            model_name="turnrecord", name="awaiting_report",
            field=models.BooleanField(db_default=False, default=False)),
        migrations.AddIndex(
            model_name="turnrecord",
            index=models.Index(condition=models.Q(("awaiting_report", True)), fields=["finished_at"],
                               name="idx_turn_records_awaiting")),
    ]
