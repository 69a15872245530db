"""Fencing: ``leader_term``, the current leadership term (one row).

Revision ID: 0005_leader_term
Revises: 0004_usage_alerts
Create Date: 2026-12-01 11:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_leader_term"
down_revision: str | Sequence[str] | None = "0004_usage_alerts"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "leader_term",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("term", sa.BigInteger(), nullable=False),
        sa.Column("holder", sa.String(length=256), nullable=False),
        sa.Column("since", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("leader_term")
