"""Takeover URLs, under the console's ``actions/<verb>/<session id>`` space (the id last: see console_app.urls)."""

from django.urls import path

from sessions_app import converters  # noqa: F401 - registers <session:…>
from takeover_app import views

urlpatterns = [
    path("actions/takeover/<session:session_id>/", views.take_over, name="takeover-take-session"),
    path("actions/handback/<session:session_id>/", views.hand_back, name="takeover-hand-back-session"),
    path("actions/reply/<session:session_id>/", views.reply, name="takeover-send-reply"),
    path("actions/reply-resend/<int:reply_id>/", views.resend, name="takeover-resend-reply"),
    path("actions/cancel-turn/<session:session_id>/", views.cancel_turn, name="takeover-cancel-turn"),
    path("actions/escalation-not-needed/<session:session_id>/", views.mark_not_needed,
         name="takeover-mark-escalation-not-needed"),
]
