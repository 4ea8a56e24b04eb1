"""Nothing to administer yet: agents are code (see agents_app.registry)."""
