"""Fixtures shared with the control loop's tests: upkeep runs beside a real loop."""

from tests.control.conftest import (  # noqa: F401
    cluster,
    make_loop,
    sessions,
    state_root,
    submit,
)
