"""The health page (``/health/``), its actions, the dashboard (``/dashboard/``) and ``/metrics``."""

from django.urls import path

from health_app import metrics, views
from sessions_app import converters  # noqa: F401 - registers <session:…>

urlpatterns = [
    path("health/", views.health_page, name="health-show-health"),
    path("dashboard/", views.dashboard_page, name="health-show-dashboard"),
    path("health/deliveries/retry/", views.retry_deliveries, name="health-retry-deliveries"),
    path("health/replies/resend/", views.resend_replies, name="health-resend-replies"),
    path("health/operator-replies/resend/", views.resend_operator_replies, name="health-resend-operator-replies"),
    path("health/sessions/<session:session_id>/cancel/", views.cancel_turn, name="health-cancel-turn"),
    path("health/sessions/<session:session_id>/release/", views.release_lease, name="health-release-lease"),
    path("metrics", metrics.metrics_view, name="health-show-metrics"),
]
