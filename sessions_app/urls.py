"""Console URLs (session list, detail, operator actions) — filled in by the console (issue 5)."""

from django.urls import path  # noqa: F401

urlpatterns: list = []
