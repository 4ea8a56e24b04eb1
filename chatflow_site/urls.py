"""Root URLconf: the console (sessions_app), the agents pages (agents_app), auth and the admin."""

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import include, path
from django.views.decorators.http import require_GET

from agents_app import views as agents_views
from api_app.api import api as api_v1
from chatflow_site import docs, errors, probes

handler403 = errors.forbidden
handler404 = errors.not_found
handler500 = errors.server_error


@require_GET
def healthz(request: HttpRequest) -> HttpResponse:
    """Liveness probe for process managers and the dev.py smoke test; touches no database."""
    return HttpResponse("ok", content_type="text/plain")


urlpatterns = [
    path("healthz/", healthz, name="site-health"),
    path("readyz/", probes.readyz, name="site-ready"),  # readiness: the database and the channel layer answer
    path("favicon.ico", errors.favicon, name="site-favicon"),
    path("accounts/logout/", errors.SiteLogoutView.as_view(), name="logout"),  # GET: a page with the button
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    path("docs/", docs.list_pages, name="docs-list-pages"),  # docs/*.md for console users
    path("docs/<slug:page>/", docs.show_page, name="docs-show-page"),
    path("agents/", include("agents_app.urls")),
    path("chat/", agents_views.chat_page, name="chat-open-chat"),  # live chat test page (ws/chat/)
    path("chat/send/", agents_views.chat_without_script, name="chat-send-message"),  # the form without JS
    path("", include("webhooks_app.urls")),  # /webhooks/…: the channels' endpoints
    path("", include("health_app.urls")),  # /health/ and /metrics
    path("api/v1/", api_v1.urls),  # REST API: sessions and transcript exports, OpenAPI at api/v1/openapi.json
    # The console: "/" redirects to the session list, /sessions/, /actions/…, /audit/.
    path("", include("takeover_app.urls")),  # actions/takeover/…, actions/reply/…: human takeover
    path("", include("console_app.urls")),
]
