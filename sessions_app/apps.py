from django.apps import AppConfig


class SessionsAppConfig(AppConfig):
    """Django models on the chatflow tables, the Django session store and the operator console."""

    name = "sessions_app"
    verbose_name = "Chat sessions"
    default_auto_field = "django.db.models.BigAutoField"
