"""ASGI entry point: HTTP through Django, websockets through channels' URL router.

Webhook POSTs (views marked ``lean_webhook``) skip the browser middleware: see webhooks_app.asgi. Responses
go out no faster than the client reads them: see chatflow_site.pacing.
"""

import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatflow_site.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (after Django is set up)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from agents_app.routing import websocket_urlpatterns as chat_routes  # noqa: E402
from chatflow_site.pacing import PacedResponses  # noqa: E402
from console_app.routing import websocket_urlpatterns as console_routes  # noqa: E402
from sessions_app.live import LayerGuard  # noqa: E402
from webhooks_app.asgi import LeanWebhookRouter  # noqa: E402

websocket_urlpatterns: list = [*console_routes, *chat_routes]  # every route lives under ws/

application = ProtocolTypeRouter(
    {
        "http": PacedResponses(LeanWebhookRouter(django_asgi_app)),
        "websocket": AllowedHostsOriginValidator(LayerGuard(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))),
    }
)

# Everything built so far (Django, the URL conf, the apps) lives as long as the process: move it out of
# the collector's reach, so that a full collection scans only what requests create. Without it a
# full collection in the server took 80-100 ms, stalling every request in flight (measured with
# gc.callbacks under bench/webhooks.py; with it, 6 ms). https://docs.python.org/3/library/gc.html#gc.freeze
gc.freeze()
