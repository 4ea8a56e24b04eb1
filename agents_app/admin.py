"""Nothing to administer yet: agents are code (see sessions_app.registry)."""
