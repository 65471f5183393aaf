"""The schema and every stored procedure and named statement, installed as
the package minutehand.sql (pyproject.toml maps it): read by
minutehand.store.sqlfiles through importlib.resources."""
