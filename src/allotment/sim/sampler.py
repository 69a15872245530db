"""The replay's contention sampler: how the GPUs were used while jobs waited.

After the cycles at each instant where the state changed, the driver hands the sampler
the core and the milli-GPUs held. It closes the interval since the last instant,
time-weighted: the replay seconds during which some job waited, the milli-GPU-seconds
held then, and the milli-GPU-seconds free then on nodes where none of the waiting jobs'
replicas fits (fragmentation). Looking at every node for that is costly, so the free
GPUs no waiting job can use are measured about 2,000 times over the replay and carried
between measurements. :mod:`allotment.sim.metrics` turns these sums into figures.
"""

from __future__ import annotations

import math

from allotment.domain.resources import GPU
from allotment.scheduler.session import Session


class ContentionSampler:
    """Time-weighted sums of held and unusable GPUs while jobs wait, over a replay whose
    arrivals span ``span`` replay seconds.

    ``waiting_s``: replay seconds during which some job waited; ``held_while_waiting``
    and ``unusable_while_waiting``: milli-GPU-seconds held, and free but of no use to
    the waiting jobs, during those seconds. Measured only with a :class:`Session` core.
    """

    def __init__(self, span: float) -> None:
        self.waiting_s = 0.0
        self.held_while_waiting = 0.0
        self.unusable_while_waiting = 0.0
        self._sampled_at = 0.0
        self._waiting_state: tuple[int, int] | None = None
        self._fragment_at = -math.inf
        self._fragment_every = max(1.0, span / 2_000)

    def sample(self, now: float, session: Session | None, held_gpus: int) -> None:
        """Close the interval since the last instant (time-weighted: GPUs held and free
        GPUs no waiting job could use, while jobs wait) and measure the new state:
        ``held_gpus`` milli-GPUs held now, the waiting jobs as ``session`` has them (None:
        not measured)."""
        span = now - self._sampled_at
        if span > 0 and self._waiting_state is not None:
            held, unusable = self._waiting_state
            self.waiting_s += span
            self.held_while_waiting += held * span
            self.unusable_while_waiting += unusable * span
        self._sampled_at = now
        if session is None or not session.pending_count:
            self._waiting_state = None
            return
        known = self._waiting_state[1] if self._waiting_state is not None else None
        if known is not None and now - self._fragment_at < self._fragment_every:
            unusable = known
        else:
            # Looking at every node is costly: about 2,000 times over the replay.
            self._fragment_at = now
            shapes = session.waiting_shapes(per_queue=16)
            unusable = 0
            for node in session.state.placer.nodes.values():
                free = node.free.get(GPU, 0)
                if free > 0 and not any(node.fits(shape) for shape in shapes):
                    unusable += free
        self._waiting_state = (held_gpus, unusable)
