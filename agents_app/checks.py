"""System check: CHATFLOW_AGENTS must import and build an Agent (run by `manage.py check` and `migrate`)."""

from django.core.checks import Error, register
from django.core.exceptions import ImproperlyConfigured

from sessions_app import registry


@register()
def check_agents(app_configs, **kwargs):
    try:
        registry.agents()
    except ImproperlyConfigured as err:
        return [Error(str(err), id="agents_app.E001")]
    except Exception as err:  # the factory is user code: report, don't crash the check run
        return [Error(f"CHATFLOW_AGENTS: the factory raised {type(err).__name__}: {err}", id="agents_app.E002")]
    return []
