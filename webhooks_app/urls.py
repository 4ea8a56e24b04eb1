"""Webhook endpoints (``/webhooks/<channel>/``); the console's ledger pages are in ``console_app.urls``."""

from django.urls import path

from webhooks_app import views

# Providers are configured with a URL typed by hand: each endpoint also answers without its trailing
# slash (a redirect would lose the POST's body, and Django's APPEND_SLASH refuses to make one for a POST).
_RECEIVERS = [("whatsapp", views.whatsapp), ("telegram", views.telegram), ("generic", views.generic)]

urlpatterns = [
    *(path(f"webhooks/{channel}/", view, name=f"webhooks-receive-{channel}") for channel, view in _RECEIVERS),
    *(path(f"webhooks/{channel}", view) for channel, view in _RECEIVERS),
]
