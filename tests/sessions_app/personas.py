"""Who uses the console in tests: an operator (every console permission, through the Operators group),
a read-only viewer (Viewers group), an outsider (staff in no group) and a customer (not staff) —
plus the anonymous visitor, who is simply a client that never logged in."""

from __future__ import annotations

from django.contrib.auth.models import Group, User
from django.test import Client

PASSWORD = "correct horse battery staple 42"


def _user(username: str, *, staff: bool = True, group: str | None = None) -> User:
    user = User.objects.create_user(username, f"{username}@example.test", PASSWORD, is_staff=staff)
    if group:
        user.groups.add(Group.objects.get(name=group))
    return user


def operator(username: str = "olga.operator") -> User:
    return _user(username, group="Operators")


def viewer(username: str = "victor.viewer") -> User:
    return _user(username, group="Viewers")


def outsider(username: str = "oscar.outsider") -> User:
    return _user(username)


def customer(username: str = "carla.customer") -> User:
    """Logged in, in the Operators group even, but not staff: still no console."""
    return _user(username, staff=False, group="Operators")


def client_for(user: User | None, *, csrf: bool = False) -> Client:
    """A test client logged in as ``user`` (anonymous for None); ``csrf`` turns CSRF checks on."""
    client = Client(enforce_csrf_checks=csrf)
    if user is not None:
        client.force_login(user)
    return client
