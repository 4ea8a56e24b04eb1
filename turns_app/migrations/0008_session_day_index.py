"""The turn records get an index on (session_id, started_at): the daily budget reads a session's records of one
day (takeover_app.budget) without walking its older ones. Only a turn's open writes it (started_at never changes)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('turns_app', '0007_cancelled_for_good'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='turnrecord',
            index=models.Index(fields=['session_id', 'started_at'], name='idx_turn_records_session_day'),
        ),
    ]
