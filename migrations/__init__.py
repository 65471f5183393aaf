"""The Alembic environment and revisions, installed as the package
minutehand.migrations (pyproject.toml maps it): found by
minutehand.store.migrate through importlib.resources."""
