"""The rollups count records by a ``folded`` flag instead of an id watermark: the records the watermark had
counted are flagged, then the watermark's columns make way for the lock row's ``generation``."""

from django.db import migrations, models


def flag_counted(apps, schema_editor):
    db = schema_editor.connection.alias  # the database being migrated (``migrate --database``), not default
    records = apps.get_model("turns_app", "TurnRecord")
    for mark in apps.get_model("turns_app", "RollupWatermark").objects.using(db).all():
        records.objects.using(db).filter(id__lte=mark.last_id).exclude(id__in=mark.pending or []).exclude(
            status="running").update(folded=True)


class Migration(migrations.Migration):
    dependencies = [("turns_app", "0002_dashboard_rollups")]

    operations = [
        migrations.AddField(
            model_name="turnrecord", name="folded", field=models.BooleanField(db_default=False, default=False)),
        migrations.AddIndex(
            model_name="turnrecord",
            index=models.Index(condition=models.Q(folded=False), fields=["id"], name="idx_turn_records_unfolded")),
        # Irreversible: going back would bring the watermark back at 0 and fold every record again.
        migrations.RunPython(flag_counted),
        migrations.RemoveField(model_name="rollupwatermark", name="last_id"),
        migrations.RemoveField(model_name="rollupwatermark", name="pending"),
        migrations.AddField(model_name="rollupwatermark", name="generation", field=models.BigIntegerField(default=0)),
        migrations.AddField(model_name="rollupwatermark", name="folded_at",
                            field=models.DateTimeField(blank=True, null=True)),
        migrations.RenameModel("RollupWatermark", "RollupState"),
    ]
