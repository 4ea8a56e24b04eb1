"""agents_app has no tables yet: agents are code, registered through CHATFLOW_AGENTS."""
