"""chatflow-agent 0.3.4's own runtime tests, run against our package (see README.md)."""
