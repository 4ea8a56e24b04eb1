"""Root URLconf: the console (sessions_app), the agents pages (agents_app), auth and the admin."""

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import include, path
from django.views.decorators.http import require_GET
from django.views.generic import RedirectView


@require_GET
def healthz(request: HttpRequest) -> HttpResponse:
    """Liveness probe for process managers and the dev.py smoke test; touches no database."""
    return HttpResponse("ok", content_type="text/plain")


urlpatterns = [
    path("healthz/", healthz, name="site-health"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    path("agents/", include("agents_app.urls")),
    path("", include("sessions_app.urls")),
    # Until the console's session list exists (issue 5) the front door is the admin.
    path("", RedirectView.as_view(pattern_name="admin:index"), name="site-home"),
]
