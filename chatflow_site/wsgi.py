"""WSGI entry point (HTTP only; live updates need the ASGI application)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatflow_site.settings")
application = get_wsgi_application()
