from django.apps import AppConfig


class SearchAppConfig(AppConfig):
    """The full-text index over the chatflow tables (kept by the database's triggers) and the search syntax."""

    name = "search_app"
    verbose_name = "Search"
    default_auto_field = "django.db.models.BigAutoField"
