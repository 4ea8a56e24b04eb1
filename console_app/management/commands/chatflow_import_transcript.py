"""`manage.py chatflow_import_transcript PATH [--replace]`: read exported transcripts back into sessions.

PATH is a JSON transcript (``/api/v1/sessions/<id>/transcript?format=json``) or a bulk export
(``/api/v1/export.jsonl``, one transcript per line, read line by line). See ``console_app.restore``.
"""

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser

from console_app.restore import RestoreError, restore


class Command(BaseCommand):
    help = "Import JSON or JSONL transcripts exported by the API into sessions (through the session store)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", help="a .json transcript or a .jsonl bulk export")
        parser.add_argument("--replace", action="store_true", help="overwrite sessions that already exist")

    def handle(self, *args, path: str, replace: bool, **options) -> None:
        file = Path(path)
        if not file.is_file():
            raise CommandError(f"No file {path!r}.")
        try:
            with file.open(encoding="utf-8") as handle:
                if file.suffix == ".jsonl":
                    docs = (json.loads(line) for line in handle if line.strip())
                else:
                    docs = iter([json.load(handle)])
                for doc in docs:
                    done = restore(doc, replace=replace)
                    note = f" ({done.skipped} unreadable skipped)" if done.skipped else ""
                    self.stdout.write(f"Imported {done.session_id!r}: {done.messages} messages{note}.")
        except (RestoreError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
