"""Telemetry and alerts: ``job_usage`` and ``device_usage`` (samples aggregated per
interval) and ``alerts`` (one row per alert, with its webhook delivery).

Revision ID: 0004_usage_alerts
Revises: 0003_audit
Create Date: 2026-11-30 11:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_usage_alerts"
down_revision: str | Sequence[str] | None = "0003_audit"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROW_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "job_usage",
        sa.Column("id", ROW_ID, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("interval_start", sa.Float(), nullable=False),
        sa.Column("interval_s", sa.Float(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("gpu_util_avg", sa.Float(), nullable=True),
        sa.Column("gpu_util_max", sa.Float(), nullable=True),
        sa.Column("gpu_memory_max", sa.BigInteger(), nullable=True),
        sa.Column("cpu_avg", sa.Float(), nullable=True),
        sa.Column("memory_max", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_job_usage_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_usage")),
        sa.UniqueConstraint(
            "job_id", "attempt", "interval_start", name=op.f("uq_job_usage_job_id")
        ),
    )
    op.create_index("ix_job_usage_interval_start", "job_usage", ["interval_start"])
    op.create_table(
        "device_usage",
        sa.Column("id", ROW_ID, autoincrement=True, nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("device", sa.Integer(), nullable=False),
        sa.Column("interval_start", sa.Float(), nullable=False),
        sa.Column("interval_s", sa.Float(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("util_avg", sa.Float(), nullable=True),
        sa.Column("util_max", sa.Float(), nullable=True),
        sa.Column("memory_max", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_device_usage")),
        sa.UniqueConstraint("node", "device", "interval_start", name=op.f("uq_device_usage_node")),
    )
    op.create_index("ix_device_usage_interval_start", "device_usage", ["interval_start"])
    op.create_table(
        "alerts",
        sa.Column("id", ROW_ID, autoincrement=True, nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=True),
        sa.Column("tenant", sa.String(length=128), nullable=True),
        sa.Column("queue", sa.String(length=128), nullable=True),
        sa.Column("dedupe_key", sa.String(length=256), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.Column("webhook", sa.String(length=2048), nullable=True),
        sa.Column("delivery", sa.String(length=16), nullable=False),
        sa.Column("tries", sa.Integer(), nullable=False),
        sa.Column("next_try_at", sa.Float(), nullable=True),
        sa.Column("delivered_at", sa.Float(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_alerts_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alerts")),
        sa.UniqueConstraint("dedupe_key", name=op.f("uq_alerts_dedupe_key")),
    )
    op.create_index("ix_alerts_delivery", "alerts", ["delivery", "next_try_at"])
    op.create_index("ix_alerts_tenant_at", "alerts", ["tenant", "at"])


def downgrade() -> None:
    op.drop_index("ix_alerts_tenant_at", table_name="alerts")
    op.drop_index("ix_alerts_delivery", table_name="alerts")
    op.drop_table("alerts")
    op.drop_index("ix_device_usage_interval_start", table_name="device_usage")
    op.drop_table("device_usage")
    op.drop_index("ix_job_usage_interval_start", table_name="job_usage")
    op.drop_table("job_usage")
