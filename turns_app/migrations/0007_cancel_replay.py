"""A record an operator cancelled so that its message is played again (a takeover "now") says so (``replay``):
the stopped turn's process reads its cancel from the record, keyed by its lease owner. A database default, so
the turn path's INSERT needs no change."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("turns_app", "0006_unknown_usage")]

    operations = [
        migrations.AddField(model_name="turnrecord", name="replay",
                            field=models.BooleanField(db_default=False, default=False)),
    ]
