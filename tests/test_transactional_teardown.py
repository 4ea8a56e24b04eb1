"""A transactional test's teardown leaves the database as its migration did: the content types, permissions
and console groups post_migrate wrote are back after a test deleted them, and post_migrate finds nothing to add."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.core.management.sql import emit_post_migrate_signal
from django.db import connection

pytestmark = pytest.mark.django_db(transaction=True)

MIGRATED = pytest.StashKey[tuple]()


def migrated() -> tuple[list[tuple[str, str]], list[tuple[str, str, str]], list[tuple[str, tuple[str, ...]]]]:
    return (sorted(ContentType.objects.values_list("app_label", "model")),
            sorted(Permission.objects.values_list("content_type__app_label", "codename", "name")),
            sorted((g.name, tuple(sorted(g.permissions.values_list("codename", flat=True))))
                   for g in Group.objects.all()))


def test_a_test_deletes_the_groups_permissions_and_content_types(request):
    request.config.stash[MIGRATED] = migrated()
    assert Group.objects.exists() and Permission.objects.exists()
    Group.objects.all().delete()
    ContentType.objects.all().delete()  # and the permissions with them


def test_the_next_test_finds_them_as_the_migration_left_them(request):
    if MIGRATED not in request.config.stash:
        pytest.skip("runs after the test that deletes them")
    assert migrated() == request.config.stash[MIGRATED]
    emit_post_migrate_signal(0, False, connection.alias)
    assert migrated() == request.config.stash[MIGRATED]
    operators = Group.objects.create(name="new")
    operators.permissions.add(Permission.objects.get(codename="view_group"))  # new rows get fresh ids
    assert ContentType.objects.get_for_model(Group) == Permission.objects.get(codename="view_group").content_type
