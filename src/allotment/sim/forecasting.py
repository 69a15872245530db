"""The replay's start forecaster: how well the core foresees when a job will start.

Every ``every``-th job to arrive is sampled. After the cycles at the instant it arrived,
its start is forecast: its start if it already started, else as the session
foresees it (:func:`forecast_start`) with run times learned from the jobs that finished
so far. :mod:`allotment.sim.metrics` compares the forecasts with the true starts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from allotment.scheduler.forecast import RuntimeHistory, forecast_start
from allotment.scheduler.session import Session
from allotment.sim.results import JobResult


class StartForecaster:
    """Forecasts the start of every ``every``-th arriving job (0: none).

    ``history`` holds the run times learned so far, ``predictions`` each sampled job's
    forecast (None: none could be made), ``seconds`` the wall time spent forecasting.
    """

    def __init__(self, every: int, owners: Mapping[str, str] | None = None) -> None:
        self.every = max(0, every)
        self.owners: Mapping[str, str] = {} if owners is None else owners
        """Each job's user, where the trace names one."""
        self.history = RuntimeHistory()
        self.predictions: dict[str, float | None] = {}
        self.seconds = 0.0
        self._arrived = 0
        self._due: list[str] = []

    @property
    def due(self) -> bool:
        """Some sampled job arrived and awaits its forecast."""
        return bool(self._due)

    def arrived(self, job_id: str) -> None:
        """Count an arrival; sample it if it is an ``every``-th one."""
        self._arrived += 1
        if self.every and self._arrived % self.every == 0:
            self._due.append(job_id)

    def learn(
        self, job_id: str, queue: str, gpus: int, runtime: float, *, limit: float | None = None
    ) -> None:
        """Job ``job_id`` of ``queue`` holding ``gpus`` milli-GPUs ran ``runtime`` replay
        seconds, under its declared ``limit`` (``max_runtime``) if it had one. Nothing
        when no job is sampled (``every`` 0): no forecast will read it."""
        if self.every:
            user = self.owners.get(job_id)
            self.history.record(queue, gpus, runtime, limit=limit, user=user)

    def predict(
        self,
        now: float,
        session: Session | None,
        first_start: Callable[[str], float | None],
    ) -> None:
        """Forecast, after the cycles at ``now``, when each sampled job that arrived at
        ``now`` will start: at once if it already has (``first_start``), else as the
        session foresees it with run times learned from the jobs finished so far (None
        without a session)."""
        began = time.perf_counter()
        for job_id in self._due:
            predicted = first_start(job_id)
            if predicted is None and session is not None:
                predicted = forecast_start(
                    session, job_id, self.history, now=now, owners=self.owners
                )
            self.predictions[job_id] = predicted
        self._due.clear()
        self.seconds += time.perf_counter() - began

    def annotate(self, results: Mapping[str, JobResult]) -> None:
        """Write each sampled job's forecast into its result."""
        for job_id, predicted in self.predictions.items():
            result = results[job_id]
            result.sampled = True
            result.predicted_start = predicted
