"""Persistence: SQLAlchemy tables, repositories and Alembic migrations (SQLite or PostgreSQL).

Imports the domain and SQLAlchemy only. Repository functions take a ``Session`` and never
commit: the caller owns the transaction, so a cycle's decisions land in one commit.
"""
