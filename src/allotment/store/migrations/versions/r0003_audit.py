"""Audit trail: the hash-chained, append-only ``audit_records`` table.

Revision ID: 0003_audit
Revises: 0002_tokens
Create Date: 2026-11-30 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_audit"
down_revision: str | Sequence[str] | None = "0002_tokens"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RECORD_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "audit_records",
        sa.Column("id", RECORD_ID, autoincrement=False, nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("user", sa.String(length=128), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=True),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("object", sa.String(length=512), nullable=False),
        sa.Column("source", sa.String(length=128), nullable=False),
        sa.Column("result", sa.String(length=64), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.Column("prev_hash", sa.String(length=64), nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_records")),
    )
    op.create_index("ix_audit_records_at", "audit_records", ["at"])
    op.create_index("ix_audit_records_tenant_at", "audit_records", ["tenant", "at"])
    op.create_index("ix_audit_records_user_at", "audit_records", ["user", "at"])


def downgrade() -> None:
    op.drop_index("ix_audit_records_user_at", table_name="audit_records")
    op.drop_index("ix_audit_records_tenant_at", table_name="audit_records")
    op.drop_index("ix_audit_records_at", table_name="audit_records")
    op.drop_table("audit_records")
