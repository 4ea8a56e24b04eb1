"""Agents page (issue 5)."""

from django.urls import path

from agents_app import views

urlpatterns = [
    path("", views.agent_list, name="agents-list-agents"),
    path("escalation-check/", views.escalation_check, name="agents-check-escalation"),
]
