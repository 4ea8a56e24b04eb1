"""Agents page and live chat test page — filled in by the console (issue 5)."""

from django.urls import path  # noqa: F401

urlpatterns: list = []
