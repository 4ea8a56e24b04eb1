"""Websocket routes of the console (under ``ws/``), included by ``chatflow_site.asgi``."""

from django.urls import path, re_path

from console_app import consumers
from sessions_app import live

live.mark_serving()  # this process serves the consumers: its own run events reach them in any layer

websocket_urlpatterns = [
    path("ws/sessions/", consumers.SessionListConsumer.as_asgi(), name="ws-sessions"),
    # Any session id, slashes and newlines included (the page percent-encodes it; the ASGI path arrives
    # decoded). Not <path:…>: its ".+" stops at a newline, and such a session's page reconnected for ever.
    re_path(r"^ws/sessions/(?P<session_id>(?s:.+))/$", consumers.SessionConsumer.as_asgi(), name="ws-session"),
]
