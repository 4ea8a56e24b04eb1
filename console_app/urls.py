"""Console URLs. Session ids are arbitrary strings (``+15550100``, ``tg:998877``, ``a/b``, ``olá 👋``): they
are captured with ``<session:…>`` (``<path:…>`` minus NUL, see :mod:`sessions_app.converters`) at the end of
the URL, and actions live under ``actions/<verb>/`` (one prefix per verb) rather than after the id, so no
session id can be mistaken for an action."""

from django.urls import path

from console_app import ledger, views
from sessions_app import converters  # noqa: F401 - registers <session:…>

urlpatterns = [
    path("", views.home, name="site-home"),
    path("sessions/", views.session_list, name="sessions-list-sessions"),
    path("sessions/<session:session_id>/", views.session_detail, name="sessions-show-session"),
    path("find/<session:session_id>/", views.session_find, name="sessions-find-session"),
    path("actions/handoff/<session:session_id>/", views.session_handoff, name="sessions-handoff-session"),
    path("actions/rollback-preview/<session:session_id>/", views.session_rollback_preview,
         name="sessions-preview-rollback"),
    path("actions/rollback/<session:session_id>/", views.session_rollback, name="sessions-rollback-session"),
    path("actions/delete-confirm/<session:session_id>/", views.session_delete_confirm, name="sessions-confirm-delete"),
    path("actions/delete/<session:session_id>/", views.session_delete, name="sessions-delete-session"),
    path("actions/handback-confirm/<session:session_id>/", views.session_handback_confirm,
         name="sessions-confirm-handback"),
    path("audit/", views.audit_list, name="sessions-list-actions"),
    # The dedup ledger (webhooks_app's rules): under /webhooks/ as before.
    path("webhooks/deliveries/<int:delivery_id>/retry/", ledger.retry_delivery, name="webhooks-retry-delivery"),
    path("webhooks/deliveries/<int:delivery_id>/resend/", ledger.resend_reply, name="webhooks-resend-reply"),
    path("webhooks/attention/", ledger.attention_list, name="webhooks-list-attention"),
    path("webhooks/ledger/<session:session_id>/", ledger.session_ledger, name="webhooks-show-ledger"),
]
