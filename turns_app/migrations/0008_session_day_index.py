"""The turn records get an index on (session_id, started_at) of the ended records: the daily budget reads a session's
records of one day (takeover_app.budget) without walking its older ones. Partial (not running), so that a turn's
open and close, which look for running records, keep their own index."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('turns_app', '0007_cancelled_for_good'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='turnrecord',
            index=models.Index(fields=['session_id', 'started_at'], condition=~models.Q(status='running'),
                               name='idx_turn_records_session_day'),
        ),
    ]
