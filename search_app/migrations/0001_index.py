"""The full-text index: its tables and the triggers that keep it in step (search_app.schema), backfilled from the
messages and sessions already stored (a 0.3.4 database is searchable after ``migrate``), with a progress bar.

Reversing drops the index; the chatflow tables are left as they are.
"""

from django.db import migrations
from tqdm import tqdm

from search_app import index, schema


def create_index(apps, schema_editor):
    connection = schema_editor.connection
    schema.install(connection)
    bar = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, desc="Indexing messages", unit="message", disable=None)
        bar.update(done - bar.n)

    index.rebuild(connection.alias, progress)
    if bar is not None:
        bar.close()


def drop_index(apps, schema_editor):
    schema.uninstall(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [("sessions_app", "0007_sessionlease_acquired_at")]

    operations = [migrations.RunPython(create_index, drop_index, elidable=False)]
