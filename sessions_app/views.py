"""Console views (session list, detail, operator actions) — issue 5."""
