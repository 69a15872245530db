"""What the API does, without HTTP: submit, cancel, read jobs and events, describe the
queues.

Each function opens and commits its own session. Domain errors pass through unchanged;
the app's one handler turns them into HTTP.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import secrets
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from allotment.api import cluster_config, explain, fleet, queue_view, schemas
from allotment.api.errors import BatchTooLarge, IdempotencyKeyReused
from allotment.api.logs import read_log
from allotment.api.policy import Owned
from allotment.api.queue_view import SharedViews
from allotment.control.cluster_state import ClusterState
from allotment.control.services import free_port
from allotment.domain.cluster import Cluster, PriorityClass, Queue
from allotment.domain.errors import AllotmentError, ConfigError, Conflict, Issue, MountNotAllowed
from allotment.domain.isolation import check_execution
from allotment.domain.job import JobSpec, JobType
from allotment.domain.lifecycle import JobState
from allotment.domain.loading import check_job, load_cluster_text, load_job_text
from allotment.domain.notebook import notebook_path, serving_notebook
from allotment.domain.scopes import check_mounts
from allotment.domain.tenancy import DEFAULT_TENANT
from allotment.scheduler.fleet import FleetFit
from allotment.scheduler.lending import Loan
from allotment.scheduler.snapshot import ReplicaRequest, SchedulerPolicy, Snapshot
from allotment.store import configs as config_store
from allotment.store import idempotency
from allotment.store import jobs as job_store
from allotment.store.batching import GroupCommit
from allotment.store.layout import Stream
from allotment.store.models import Event, Job
from allotment.store.views import last_event_id

Checked = tuple[JobSpec, Queue, PriorityClass]
"""A job file parsed and checked: its spec, its queue and its priority class."""

MAX_BATCH = 1_000
"""Most job specs one batch submission may hold (more: ``batch_too_large``, HTTP 413)."""

ANONYMOUS = "anonymous"
SPEC_SOURCE = "spec"


def job_out(job: Job) -> schemas.JobOut:
    reason = None
    if job.reason_code is not None:
        reason = schemas.ReasonOut(
            code=job.reason_code,
            message=job.reason_message or "",
            detail=dict(job.reason_detail or {}),
            since=job.reason_since,
        )
    return schemas.JobOut(
        id=job.id,
        name=job.name,
        queue=job.queue,
        tenant=job.tenant,
        user=job.user,
        type=job.type,
        priority_class=job.priority_class,
        state=job.state,
        failure_class=job.failure_class,
        attempt=job.attempt,
        submit_time=job.submit_time,
        not_before=job.not_before,
        reason=reason,
        spec=dict(job.spec),
        created_at=job.created_at,
        updated_at=job.updated_at,
        endpoint=notebook_path(job.id) if job.type == JobType.NOTEBOOK.value else None,
    )


def event_out(event: Event) -> schemas.EventOut:
    return schemas.EventOut(
        id=event.id,
        job=event.job_id,
        at=event.at,
        kind=event.kind,
        from_state=event.from_state,
        to_state=event.to_state,
        message=event.message,
        detail=dict(event.detail or {}),
    )


def _digest(route: str, texts: Sequence[str]) -> str:
    """What binds an idempotency key to its request: the route and the specs."""
    return hashlib.sha256(json.dumps([route, list(texts)]).encode()).hexdigest()


def check_data_scopes(spec: JobSpec, cluster: Cluster, tenant: str) -> None:
    """Raise :class:`MountNotAllowed` (422) when ``spec`` mounts anything outside the
    data scopes of ``tenant`` (the tenant of the job's queue)."""
    declared = cluster.tenants.get(tenant)
    scopes = list(declared.data_scopes) if declared is not None else []
    issues = check_mounts(spec.mounts, scopes, tenant=tenant)
    if issues:
        raise MountNotAllowed(
            issues, tenant=tenant, scopes=[s.path for s in scopes], source=SPEC_SOURCE
        )


def _usable_by(may_submit: Callable[[Queue], None] | None) -> Callable[[Queue], bool] | None:
    """``may_submit`` as a test: the queues named in an error are only those the
    submitter may use (another tenant's must not leak)."""
    if may_submit is None:
        return None
    check = may_submit

    def usable(queue: Queue) -> bool:
        try:
            check(queue)
        except AllotmentError:
            return False
        return True

    return usable


class JobService:
    """The API's operations on one cluster and one store."""

    def __init__(
        self,
        *,
        cluster: Cluster | ClusterState,
        sessions: sessionmaker[Session],
        clock: Callable[[], float],
        work_root: Path | None = None,
        policy: SchedulerPolicy | None = None,
        writes: GroupCommit | None = None,
    ) -> None:
        self.state = ClusterState.of(cluster)
        """The cluster in use (the server's, shared with the control loop)."""
        self.sessions = sessions
        self.writes = writes if writes is not None else GroupCommit(sessions)
        """Submissions are written grouped with other requests' writes."""
        self.clock = clock
        self.work_root = work_root
        self.policy = policy
        self._apply_lock = threading.RLock()
        self._fleet: FleetFit | None = None
        self.lines: SharedViews[queue_view.Line] = SharedViews()
        self.loans: SharedViews[tuple[Loan, ...]] = SharedViews()
        """Queues' lines and loans, shared by the dashboard's viewers."""
        self.guesses: SharedViews[str | None] = SharedViews(
            ttl_s=explain.GUESS_TTL_S, max_names=explain.GUESSES_KEPT
        )
        """Jobs' starts guessed from history (``allot why``, a job's page polling it)."""
        self.line_guesses: SharedViews[dict[str, str]] = SharedViews(ttl_s=explain.GUESS_TTL_S)
        """Every waiting job's start guessed from history in one play forward, for the
        queues' lines (made again at most every :data:`~allotment.api.explain.GUESS_TTL_S`)."""

    def submit(
        self,
        *,
        spec_text: str,
        user: str = ANONYMOUS,
        may_submit: Callable[[Queue], None] | None = None,
        idempotency_key: str | None = None,
    ) -> schemas.JobOut:
        """Parse ``spec_text`` like a job file, check it against the cluster, store it
        and move it to ``pending``. Raises :class:`ConfigError` naming key and line;
        ``may_submit`` is given the job's queue first and raises when ``user`` may not.
        With ``idempotency_key``, a repeat of the same request answers the job the first
        one made (as it is now) instead of making another (:meth:`_once`)."""
        checked = self._job(self.check_spec(spec_text, SPEC_SOURCE, may_submit), SPEC_SOURCE)

        def store(session: Session) -> list[Job]:
            return [self._store(session, checked, user, self.clock())]

        (job,) = self._once(user, idempotency_key, _digest("jobs", [spec_text]), store)
        return job

    def submit_many(
        self,
        *,
        spec_texts: Sequence[str],
        user: str = ANONYMOUS,
        may_submit: Callable[[Queue], None] | None = None,
        idempotency_key: str | None = None,
    ) -> list[schemas.JobOut]:
        """:meth:`submit` for several specs in one transaction: all are stored, in order
        (strictly increasing submit times), or none. The first invalid spec raises
        :class:`ConfigError` with source ``specs.<index>``; more than
        :data:`MAX_BATCH` raises :class:`BatchTooLarge`."""
        if len(spec_texts) > MAX_BATCH:
            raise BatchTooLarge(
                f"{len(spec_texts)} specs in one batch; at most {MAX_BATCH}",
                fields={"max_batch": MAX_BATCH, "count": len(spec_texts)},
            )
        checked = [
            self._job(self.check_spec(text, f"specs.{i}", may_submit), f"specs.{i}")
            for i, text in enumerate(spec_texts)
        ]

        def store(session: Session) -> list[Job]:
            jobs = []
            at = -math.inf
            for item in checked:
                # Strictly increasing submit times keep the batch's order in the queues.
                at = max(self.clock(), math.nextafter(at, math.inf))
                jobs.append(self._store(session, item, user, at))
            return jobs

        return self._once(user, idempotency_key, _digest("jobs:batch", spec_texts), store)

    def _once(
        self,
        user: str,
        key: str | None,
        digest: str,
        store: Callable[[Session], list[Job]],
    ) -> list[schemas.JobOut]:
        """Run ``store`` in one transaction (grouped with other requests' writes: it may
        run again, alone, when the group fails), at most once per ``(user, key)``: a repeat
        of the request answers the jobs it made; the key with another request raises
        :class:`IdempotencyKeyReused` (409)."""

        def write(session: Session) -> list[schemas.JobOut]:
            now = self.clock()
            earlier = idempotency.earlier(session, user, key) if key else None
            if earlier is not None and not earlier.expired(now):
                if earlier.digest != digest:
                    raise IdempotencyKeyReused(
                        "this Idempotency-Key was sent with another request before; "
                        "use a new key for a new submission",
                        fields={"key": key},
                    )
                return [job_out(job_store.get_job(session, j)) for j in earlier.job_ids]
            jobs = store(session)
            if key:
                ids = [job.id for job in jobs]
                # An expired record is replaced; without one there is nothing to delete.
                replacing = earlier is not None
                idempotency.record(session, user, key, digest, ids, now=now, replacing=replacing)
            return [job_out(job) for job in jobs]

        for _ in range(3):
            try:
                return self.writes.run(write)
            except IntegrityError:
                if not key:
                    raise
                # A concurrent request with the same key won: answer with what it made.
        raise Conflict(
            "this Idempotency-Key is being used by concurrent requests; try again",
            fields={"key": key},
        )

    def check_spec(
        self, spec_text: str, source: str, may_submit: Callable[[Queue], None] | None = None
    ) -> Checked:
        """Parse a job file and check it against the cluster in use, as the submitter
        (``may_submit`` raises when it may not use the job's queue). Raises
        :class:`ConfigError` naming key and line, or the refusal."""
        spec = load_job_text(spec_text, source=source)
        cluster = self.cluster  # one cluster for the whole check
        if may_submit is not None and spec.queue in cluster.queues:
            may_submit(cluster.queues[spec.queue])
        issues: list[Issue] = check_job(spec, cluster, usable=_usable_by(may_submit))
        if issues:
            raise ConfigError(issues, source=source)
        queue = cluster.queues[spec.queue]
        tenant = queue.tenant or DEFAULT_TENANT
        check_data_scopes(spec, cluster, tenant)
        check_execution(spec, cluster, queue, tenant, source=source)
        self._check_fits(spec, cluster, queue, source)
        priority = cluster.priority_class_for(queue, spec.priority_class)
        assert priority is not None  # check_job reported otherwise
        return spec, queue, priority

    @staticmethod
    def _job(checked: Checked, source: str) -> Checked:
        """``checked``, unless it is a service (services have their own route: their
        replicas are jobs the service controller makes) or a notebook that would run
        JupyterLab where it is not installed."""
        spec = checked[0]
        message = None
        if spec.type is JobType.SERVICE:
            message = (
                "a service is applied with POST /api/v1/services (allot submit does this "
                "for a type: service file), not submitted as a job"
            )
        elif (
            spec.type is JobType.NOTEBOOK
            and not spec.command
            and spec.image is None
            and importlib.util.find_spec("jupyterlab") is None
        ):
            message = (
                "a notebook without a command runs JupyterLab, which is not installed "
                "beside the server (pip install 'allotment[notebook]'); give it an image "
                "that has it, or a command"
            )
        if message is not None:
            path = "type" if spec.type is JobType.SERVICE else "command"
            raise ConfigError([Issue(path=path, message=message)], source=source)
        return checked

    def _check_fits(self, spec: JobSpec, cluster: Cluster, queue: Queue, source: str) -> None:
        """Refuse a job that could never run: its replicas do not all fit at once on the
        nodes of any pool it may use, even with every node empty."""
        fleet = self._fleet
        if fleet is None or fleet.cluster is not cluster:
            fleet = self._fleet = FleetFit(cluster)
        open_pools = cluster.allowed_pools(queue)
        pools = [p for p in spec.pools if p in open_pools] if spec.pools else open_pools
        replicas = [
            ReplicaRequest(name=g.name, count=g.count, resources=g.resources.as_dict())
            for g in spec.replicas
        ]
        problem = fleet.problem(replicas, pools)
        if problem is not None:
            raise ConfigError([Issue(path="replicas", message=problem)], source=source)

    def _store(self, session: Session, checked: Checked, user: str, now: float) -> Job:
        spec, queue, priority = checked
        job_id = job_store.new_job_id()
        if spec.type is JobType.NOTEBOOK:
            spec = serving_notebook(
                spec,
                job_id=job_id,
                port=free_port(),
                token=secrets.token_urlsafe(24),
                python=sys.executable if spec.image is None else None,
            )
        return job_store.create_job(
            session,
            spec,
            tenant=queue.tenant or DEFAULT_TENANT,
            user=user,
            at=now,
            priority_class=priority.name,
            job_id=job_id,
            accepted="accepted",
        )

    def owned(self, *, job_id: str) -> Owned:
        """What authorisation looks at in a job (tenant, user); raises ``NotFound``."""
        with self.sessions() as session:
            job = job_store.get_job(session, job_id)
            return Owned(kind="job", name=job.id, tenant=job.tenant, user=job.user)

    def get(self, *, job_id: str) -> schemas.JobOut:
        """One job; raises ``NotFound``."""
        with self.sessions() as session:
            return job_out(job_store.get_job(session, job_id))

    def cancel(self, *, job_id: str, user: str = ANONYMOUS) -> schemas.JobOut:
        """Cancel a job; return it, now ``cancelled``. A waiting job leaves its line at
        once; the control loop stops the replicas of a running one and frees its
        resources. Raises ``NotFound``, or ``AlreadyEnded`` (409) for an ended job."""
        with self.sessions.begin() as session:
            return job_out(job_store.cancel_job(session, job_id, at=self.clock(), by=user))

    def list(
        self,
        *,
        queue: str | None,
        states: Sequence[JobState] | None,
        limit: int,
        after: str | None,
        tenant: str | None = None,
    ) -> schemas.JobPage:
        """A page of jobs in submission order (only ``tenant``'s when given);
        ``next_after`` is set when more may follow."""
        with self.sessions() as session:
            rows = job_store.list_jobs(
                session,
                queue=queue,
                tenant=tenant,
                states=states or None,
                limit=limit + 1,
                after=after,
            )
            page = [job_out(job) for job in rows[:limit]]
        more = len(rows) > limit
        return schemas.JobPage(jobs=page, next_after=page[-1].id if more and page else None)

    def events(self, *, job_id: str) -> schemas.EventList:
        """The job's events, oldest first; raises ``NotFound`` for an unknown job."""
        with self.sessions() as session:
            job_store.get_job(session, job_id)
            events = [event_out(e) for e in job_store.events_for(session, job_id)]
        return schemas.EventList(job=job_id, events=events)

    def queues(self, *, tenant: str | None = None) -> schemas.QueueUsageTree:
        """The queue tree with nominal, used and borrowed GPUs per pool, and job counts;
        with ``tenant``, only its queues and their ancestors."""
        cluster = self.cluster
        with self.sessions() as session:
            usage = fleet.Usage(session)
        return fleet.queue_tree(cluster, usage, tenant=tenant)

    def _mark(self) -> tuple[Cluster, tuple[int, int]]:
        """The cluster in use and the state mark of a shared view: the cluster's version
        and the store's newest event id (see :mod:`allotment.api.queue_view`)."""
        version, cluster = self.state.snapshot()
        with self.sessions() as session:
            return cluster, (version, last_event_id(session))

    def queue_line(self, name: str) -> queue_view.Line:
        """Queue ``name``'s line, unscoped: computed again only when the state mark moved,
        or after :data:`~allotment.api.queue_view.VIEW_TTL_S`."""
        cluster, mark = self._mark()

        def fresh() -> queue_view.Line:
            with self.sessions() as session:

                def guesses(snapshot: Snapshot, owners: Mapping[str, str]) -> dict[str, str]:
                    return self.line_guesses.get(
                        "", (), lambda: explain.guessed_starts(session, snapshot, owners)
                    )

                return explain.queue_line(
                    session, cluster, name, now=self.clock(), policy=self.policy, guesses=guesses
                )

        return self.lines.get(name, mark, fresh)

    def fleet_loans(self) -> tuple[Loan, ...]:
        """Every loan of the fleet now (who uses whose unused quota), unscoped; shared by
        every viewer as :meth:`queue_line` is."""
        cluster, mark = self._mark()

        def fresh() -> tuple[Loan, ...]:
            with self.sessions() as session:
                return queue_view.fleet_loans(
                    session, cluster, now=self.clock(), policy=self.policy
                )

        return self.loans.get("", mark, fresh)

    def pools(self) -> schemas.PoolList:
        cluster = self.cluster
        with self.sessions() as session:
            usage = fleet.Usage(session)
        return fleet.pools(cluster, usage)

    def nodes(self, *, tenant: str | None = None) -> schemas.NodeList:
        """Every node; with ``tenant``, the jobs shown on them are only its own."""
        cluster = self.cluster
        with self.sessions() as session:
            usage = fleet.Usage(session, jobs_of=tenant)
        return fleet.nodes(cluster, usage)

    def why(self, *, job_id: str, tenant: str | None = None) -> schemas.WhyOut:
        """Why the job waits (or where it runs); raises ``NotFound``. With ``tenant``,
        holders of other tenants are shown without their job and queue names."""
        cluster = self.cluster
        with self.sessions() as session:
            return explain.why(
                session,
                cluster,
                job_id,
                now=self.clock(),
                policy=self.policy,
                tenant=tenant,
                guesses=self.guesses,
            )

    def logs(
        self,
        *,
        job_id: str,
        attempt: int | None,
        replica: str | None,
        stream: Stream,
        offset: int,
        limit: int,
        from_end: bool = False,
    ) -> schemas.LogChunk:
        """A chunk of one replica's log; see :func:`allotment.api.logs.read_log`."""
        with self.sessions() as session:
            return read_log(
                session,
                self.work_root,
                job_id,
                attempt=attempt,
                replica=replica,
                stream=stream,
                offset=offset,
                limit=limit,
                from_end=from_end,
            )

    def cluster_text(self) -> schemas.ClusterText:
        """The latest applied ``cluster.yaml`` (all null before the first apply)."""
        with self.sessions() as session:
            config = config_store.current_cluster_config(session)
            if config is None:
                return schemas.ClusterText(version=None, text=None, sha256=None, applied_at=None)
            return schemas.ClusterText(
                version=config.version,
                text=config.text,
                sha256=config.sha256,
                applied_at=config.applied_at,
            )

    @property
    def cluster(self) -> Cluster:
        """The cluster in use now."""
        return self.state.current()

    def apply_cluster(
        self,
        *,
        text: str,
        dry_run: bool,
        user: str = ANONYMOUS,
        on_change: Callable[[Cluster], None] | None = None,
    ) -> schemas.ClusterApplied:
        """Validate ``text`` (``ConfigError`` naming key and line), diff it against the
        cluster in use and, unless ``dry_run``, store it as the next version and use it
        from now on (``on_change`` is told)."""
        new = load_cluster_text(text, source=cluster_config.SOURCE)
        if new.executor != self.cluster.executor:
            issue = Issue(
                path="executor",
                message="the executor section is read when the server starts: "
                "restart allot up with -f FILE to change it",
            )
            raise ConfigError([issue], source=cluster_config.SOURCE)
        with self._apply_lock:
            changes = cluster_config.diff(self.cluster, new)
            if dry_run:
                return schemas.ClusterApplied(
                    dry_run=True, applied=False, version=None, diff=changes
                )
            with self.sessions.begin() as session:
                config, written = config_store.apply_cluster_config(
                    session, text, at=self.clock(), applied_by=user
                )
                version = config.version
            self.state.apply(new)
            if on_change is not None:
                on_change(new)
        return schemas.ClusterApplied(dry_run=False, applied=written, version=version, diff=changes)
