"""search_app has no Django models: its index tables are written by the database itself (search_app.schema)."""
