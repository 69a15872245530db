"""The replay's one error, shared by the driver, the simulated executor and the core
adapter."""

from __future__ import annotations

from allotment.domain.errors import AllotmentError


class ReplayError(AllotmentError):
    """The scheduler decided something the simulated cluster cannot do (a core bug), or
    the scheduler is not available."""

    code = "replay_error"
