"""Websocket routes of the agents app (under ``ws/``), included by ``chatflow_site.asgi``."""

from django.urls import path

from agents_app import consumers

websocket_urlpatterns = [
    path("ws/chat/", consumers.ChatConsumer.as_asgi(), name="ws-chat"),
]
