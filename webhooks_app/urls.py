"""Webhook endpoints (``/webhooks/<channel>/``) and the console's ledger actions."""

from django.urls import path

from sessions_app import converters  # noqa: F401 - registers <session:…>
from webhooks_app import views

# Providers are configured with a URL typed by hand: each endpoint also answers without its trailing
# slash (a redirect would lose the POST's body, and Django's APPEND_SLASH refuses to make one for a POST).
_RECEIVERS = [("whatsapp", views.whatsapp), ("telegram", views.telegram), ("generic", views.generic)]

urlpatterns = [
    *(path(f"webhooks/{channel}/", view, name=f"webhooks-receive-{channel}") for channel, view in _RECEIVERS),
    *(path(f"webhooks/{channel}", view) for channel, view in _RECEIVERS),
    path("webhooks/deliveries/<int:delivery_id>/retry/", views.retry_delivery, name="webhooks-retry-delivery"),
    path("webhooks/deliveries/<int:delivery_id>/resend/", views.resend_reply, name="webhooks-resend-reply"),
    path("webhooks/attention/", views.attention_list, name="webhooks-list-attention"),
    path("webhooks/ledger/<session:session_id>/", views.session_ledger, name="webhooks-show-ledger"),
]
