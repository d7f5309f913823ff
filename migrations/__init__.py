"""Alembic migrations for officellm's SQLite database (driven by app/db/migrate.py)."""
