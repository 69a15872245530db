"""``ix_attempts_state_end``: the latest runs that ended in a state (start forecasts
read the last successful ones) without scanning every attempt.

Revision ID: 0008_attempts_state_end
Revises: 0007_services
Create Date: 2026-12-06 21:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0008_attempts_state_end"
down_revision: str | Sequence[str] | None = "0007_services"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_attempts_state_end", "attempts", ["state", "end_time"])


def downgrade() -> None:
    op.drop_index("ix_attempts_state_end", table_name="attempts")
