"""A record an operator cancelled for good says so (``cancelled_for_good``; a takeover "now" cancels a turn to play
its message again, and a turn that lost its lease closes itself ``cancelled`` too): the stopped turn's process reads
its cancel from the record, keyed by its lease owner. A database default, so the turn path's INSERT needs no change.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("turns_app", "0006_unknown_usage")]

    operations = [
        migrations.AddField(model_name="turnrecord", name="cancelled_for_good",
                            field=models.BooleanField(db_default=False, default=False)),
    ]
