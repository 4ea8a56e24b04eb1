"""Unknown token counts and costs are NULL, never 0: a turn record's tokens, and a session's token and cost
sums (NULL while no counted turn's figure is known), with ``tokens_known`` beside ``cost_known``.

Rows written before keep their figures: a 0 stored then for a count nobody reported cannot be told apart.
"""

from django.db import migrations, models


def _unknown() -> models.BigIntegerField:
    return models.BigIntegerField(blank=True, default=None, null=True)


class Migration(migrations.Migration):
    dependencies = [("turns_app", "0005_open_records_index")]

    operations = [
        migrations.AddField(
            model_name="sessiontotals", name="tokens_known",
            field=models.BooleanField(db_default=True, default=True,
                                      help_text="False once a counted turn's token counts were unknown.")),
        *[migrations.AlterField(model_name="sessiontotals", name=name, field=_unknown())
          for name in ("input_tokens", "output_tokens", "cached_tokens", "total_tokens")],
        migrations.AlterField(
            model_name="sessiontotals", name="cost",
            field=models.DecimalField(blank=True, decimal_places=10, default=None, max_digits=20, null=True,
                                      help_text="Sum of the known costs (NULL while none is known).")),
        *[migrations.AlterField(model_name="turnrecord", name=name, field=_unknown())
          for name in ("input_tokens", "output_tokens", "cached_tokens")],
    ]
