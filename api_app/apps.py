from django.apps import AppConfig


class ApiAppConfig(AppConfig):
    """The versioned REST API (/api/v1/): sessions and transcript exports, with API tokens."""

    name = "api_app"
    verbose_name = "API"
    default_auto_field = "django.db.models.BigAutoField"
