"""Webhook endpoints (``/webhooks/<channel>/``) and the console's ledger actions."""

from django.urls import path

from sessions_app import converters  # noqa: F401 - registers <session:…>
from webhooks_app import views

urlpatterns = [
    path("webhooks/whatsapp/", views.whatsapp, name="webhooks-receive-whatsapp"),
    path("webhooks/telegram/", views.telegram, name="webhooks-receive-telegram"),
    path("webhooks/generic/", views.generic, name="webhooks-receive-generic"),
    path("webhooks/deliveries/<int:delivery_id>/retry/", views.retry_delivery, name="webhooks-retry-delivery"),
    path("webhooks/deliveries/<int:delivery_id>/resend/", views.resend_reply, name="webhooks-resend-reply"),
    path("webhooks/attention/", views.attention_list, name="webhooks-list-attention"),
    path("webhooks/ledger/<session:session_id>/", views.session_ledger, name="webhooks-show-ledger"),
]
