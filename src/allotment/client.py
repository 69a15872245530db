"""A typed HTTP client for the Allotment API (``/api/v1``).

Every method blocks until the server answers and returns the decoded JSON. A non-2xx
answer raises :class:`ClientError` built from the ``{code, message, fields}`` body; a
transport failure raises :class:`ClientError` with code ``unreachable`` and status 0.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import httpx

API_PREFIX = "/api/v1"
DEFAULT_TIMEOUT = 30.0


class ClientError(Exception):
    """An error answer from the server (or no answer at all)."""

    def __init__(
        self, code: str, message: str, *, fields: dict[str, Any] | None = None, status: int
    ) -> None:
        super().__init__(f"{code} ({status}): {message}")
        self.code = code
        self.message = message
        self.fields: dict[str, Any] = dict(fields or {})
        self.status = status


def _error_from(response: httpx.Response) -> ClientError:
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("code"), str):
        fields = body.get("fields")
        return ClientError(
            body["code"],
            str(body.get("message", "")),
            fields=fields if isinstance(fields, dict) else None,
            status=response.status_code,
        )
    return ClientError(
        "http_error",
        f"HTTP {response.status_code}: {response.text[:500]}",
        status=response.status_code,
    )


SUBMIT_TRIES = 3
"""How often a submission is sent when no answer comes back (same idempotency key)."""


def new_idempotency_key() -> str:
    """A fresh key for one submission."""
    return uuid.uuid4().hex


class AllotmentClient:
    """The API at ``base_url`` (e.g. ``http://127.0.0.1:8642``), as ``token`` if given.

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(
        self, base_url: str, token: str | None = None, *, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.server_url = base_url.rstrip("/")
        """The server's address (the API is under :data:`API_PREFIX`)."""
        self._http = httpx.Client(
            base_url=base_url.rstrip("/") + API_PREFIX, headers=headers, timeout=timeout
        )

    def __enter__(self) -> AllotmentClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ClientError("unreachable", str(exc), status=0) from exc
        if response.is_error:
            raise _error_from(response)
        return response.json()

    def submit(self, spec_text: str, *, idempotency_key: str | None = None) -> dict[str, Any]:
        """Submit a job file's text (YAML or JSON); returns the job, now ``pending``.
        Sent with an ``Idempotency-Key`` (a new one unless given) and sent again with it
        when the connection fails before an answer: the job is stored once."""
        job: dict[str, Any] = self._submission(
            "/jobs", {"spec": spec_text}, idempotency_key or new_idempotency_key()
        )
        return job

    def submit_many(
        self, spec_texts: Sequence[str], *, idempotency_key: str | None = None
    ) -> list[dict[str, Any]]:
        """Submit several job files' texts in one request: all are stored, in order, or
        none (``invalid_config`` names the first bad one as ``specs.<index>``; more than
        the server's limit is ``batch_too_large``, status 413). Returns the jobs; safe
        to retry as :meth:`submit` is."""
        body: dict[str, Any] = self._submission(
            "/jobs:batch", {"specs": list(spec_texts)}, idempotency_key or new_idempotency_key()
        )
        jobs: list[dict[str, Any]] = body["jobs"]
        return jobs

    def _submission(self, path: str, body: dict[str, Any], key: str) -> Any:
        """POST a submission with its idempotency key, again (same key) after a
        transport failure, at most :data:`SUBMIT_TRIES` times in all."""
        for attempt in range(1, SUBMIT_TRIES + 1):
            try:
                return self._request("POST", path, json=body, headers={"Idempotency-Key": key})
            except ClientError as exc:
                if exc.status != 0 or attempt == SUBMIT_TRIES:
                    raise
                time.sleep(0.2 * attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def list_jobs(
        self,
        *,
        queue: str | None = None,
        states: Iterable[str] | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> dict[str, Any]:
        """One page: ``{"jobs": [...], "next_after": id or None}``."""
        params: list[tuple[str, str | int]] = [("limit", limit)]
        if queue is not None:
            params.append(("queue", queue))
        params.extend(("state", s) for s in states or ())
        if after is not None:
            params.append(("after", after))
        page: dict[str, Any] = self._request("GET", "/jobs", params=params)
        return page

    def get_job(self, job_id: str) -> dict[str, Any]:
        """One job; ``ClientError`` with code ``not_found`` when there is none."""
        job: dict[str, Any] = self._request("GET", f"/jobs/{job_id}")
        return job

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a job; returns it, now ``cancelled``. ``ClientError`` with code
        ``already_ended`` (status 409) when it has ended, ``not_found`` when unknown."""
        job: dict[str, Any] = self._request("POST", f"/jobs/{job_id}/cancel")
        return job

    def apply_service(self, spec_text: str) -> dict[str, Any]:
        """Create the service a ``type: service`` file describes, or update the one of
        its name (its replicas roll over); returns the service with its ``url``."""
        service: dict[str, Any] = self._request("POST", "/services", json={"spec": spec_text})
        return service

    def services(self) -> list[dict[str, Any]]:
        """Every service the caller may see."""
        body: dict[str, Any] = self._request("GET", "/services")
        services: list[dict[str, Any]] = body["services"]
        return services

    def get_service(self, tenant: str, name: str) -> dict[str, Any]:
        service: dict[str, Any] = self._request("GET", f"/services/{tenant}/{name}")
        return service

    def delete_service(self, tenant: str, name: str) -> dict[str, Any]:
        """Stop every replica of the service and forget it; returns it as it was."""
        service: dict[str, Any] = self._request("DELETE", f"/services/{tenant}/{name}")
        return service

    def events(self, job_id: str) -> list[dict[str, Any]]:
        """The job's events, oldest first."""
        body: dict[str, Any] = self._request("GET", f"/jobs/{job_id}/events")
        events: list[dict[str, Any]] = body["events"]
        return events

    def queues(self) -> list[dict[str, Any]]:
        """The queue tree: each queue with ``name, tenant, leaf, nominal_gpu, children``,
        and its usage: ``usage`` (per pool: ``nominal``, ``used``, ``borrowed`` GPUs),
        ``pending`` and ``running`` (job counts of its subtree)."""
        body: dict[str, Any] = self._request("GET", "/queues")
        queues: list[dict[str, Any]] = body["queues"]
        return queues

    def why(self, job_id: str) -> dict[str, Any]:
        """Why the job waits: ``{job, state, reason, position, estimated_start,
        estimate_basis, holders}`` (and ``placement`` while it holds an allocation)."""
        body: dict[str, Any] = self._request("GET", f"/jobs/{job_id}/why")
        return body

    def logs(
        self,
        job_id: str,
        *,
        replica: str | None = None,
        stream: str = "out",
        offset: int = 0,
        limit: int = 65536,
        attempt: int | None = None,
    ) -> dict[str, Any]:
        """A chunk of one replica's log: ``{job, attempt, replica, replicas, stream,
        offset, next_offset, data, eof}``; pass ``next_offset`` back as ``offset``."""
        params: dict[str, str | int] = {"stream": stream, "offset": offset, "limit": limit}
        if replica is not None:
            params["replica"] = replica
        if attempt is not None:
            params["attempt"] = attempt
        body: dict[str, Any] = self._request("GET", f"/jobs/{job_id}/logs", params=params)
        return body

    def pools(self) -> list[dict[str, Any]]:
        """Pools: ``name, labels, price_per_gpu_hour, nodes, gpu{capacity, allocated, free}``."""
        body: dict[str, Any] = self._request("GET", "/pools")
        pools: list[dict[str, Any]] = body["pools"]
        return pools

    def nodes(self) -> list[dict[str, Any]]:
        """Nodes: ``name, pool, healthy, topology, capacity, allocated, free, jobs``."""
        body: dict[str, Any] = self._request("GET", "/nodes")
        nodes: list[dict[str, Any]] = body["nodes"]
        return nodes

    def images(self) -> dict[str, Any]:
        """The container images on each node: ``{runtime, known, message, nodes: [{node,
        images}], allowed, enforcement}``. A tenant's token sees only the images its
        tenant may run (``allowed`` lists its patterns); ``known`` is false, with a
        ``message``, when the runtime runs plain processes or the executor cannot tell."""
        body: dict[str, Any] = self._request("GET", "/images")
        return body

    def apply_cluster(self, text: str, *, dry_run: bool = False) -> dict[str, Any]:
        """Apply ``cluster.yaml`` text: ``{dry_run, applied, version, diff}``, the diff
        per section as ``{added, removed, changed}`` names."""
        body: dict[str, Any] = self._request(
            "PUT", "/cluster", json={"text": text, "dry_run": dry_run}
        )
        return body

    def whatif(
        self,
        text: str | None = None,
        *,
        since: str = "7d",
        until: str | None = None,
        policy: str | None = None,
        series: bool = False,
    ) -> dict[str, Any]:
        """Replay recorded history under the configuration in force and, with ``text``,
        under that proposed ``cluster.yaml``: ``{queues, tenants, total, fidelity,
        worse, limits, ...}`` (see the README's what-if section)."""
        query = {"since": since, "until": until, "policy": policy, "series": series}
        if text is None:
            params = {k: v for k, v in query.items() if v is not None}
            body: dict[str, Any] = self._request("GET", "/whatif", params=params)
        else:
            body = self._request("POST", "/whatif", json={"text": text, **query})
        return body

    def history_export(
        self, *, since: str = "7d", until: str | None = None, users: bool = False
    ) -> tuple[str, int]:
        """The recorded jobs as a trace CSV (``users``: with a column of pseudonyms), and
        how many never completed a run (left out)."""
        params = {"since": since} if until is None else {"since": since, "until": until}
        if users:
            params["users"] = "true"
        try:
            response = self._http.request("GET", "/history/export", params=params)
        except httpx.HTTPError as exc:
            raise ClientError("unreachable", str(exc), status=0) from exc
        if response.is_error:
            raise _error_from(response)
        return response.text, int(response.headers.get("X-Left-Out", "0"))

    def cluster(self) -> dict[str, Any]:
        """The applied ``cluster.yaml``: ``{version, text, sha256, applied_at}``."""
        body: dict[str, Any] = self._request("GET", "/cluster")
        return body

    def create_token(
        self,
        *,
        user: str,
        tenant: str | None = None,
        role: str | None = None,
        expires_in: str | None = None,
    ) -> dict[str, Any]:
        """Issue a token: ``{id, user, tenant, role, created_at, expires_at, revoked_at,
        created_by, token}``; ``token`` is shown this once."""
        body: dict[str, Any] = self._request(
            "POST",
            "/tokens",
            json={"user": user, "tenant": tenant, "role": role, "expires_in": expires_in},
        )
        return body

    def tokens(self) -> list[dict[str, Any]]:
        """The tokens the caller may manage (never their text)."""
        body: dict[str, Any] = self._request("GET", "/tokens")
        tokens: list[dict[str, Any]] = body["tokens"]
        return tokens

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        """Revoke a token; returns it, with ``revoked_at`` set."""
        body: dict[str, Any] = self._request("DELETE", f"/tokens/{token_id}")
        return body

    def audit(
        self,
        *,
        user: str | None = None,
        tenant: str | None = None,
        action: str | None = None,
        object: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 100,
        after: int | None = None,
    ) -> dict[str, Any]:
        """One page of audit records by id: ``{"records": [...], "next_after"}``, each
        ``{id, at, user, tenant, action, object, source, result, detail, prev_hash,
        hash}``; ``since``/``until`` are seconds since the epoch."""
        given = {
            "user": user,
            "tenant": tenant,
            "action": action,
            "object": object,
            "since": since,
            "until": until,
            "after": after,
        }
        params: dict[str, str | int | float] = {"limit": limit}
        params.update({k: v for k, v in given.items() if v is not None})
        body: dict[str, Any] = self._request("GET", "/audit", params=params)
        return body

    def verify_audit(self) -> dict[str, Any]:
        """Check the audit chain: ``{ok, first_bad: {id, problem} or None, checked,
        head_hash}``."""
        body: dict[str, Any] = self._request("GET", "/audit/verify")
        return body

    def report(
        self,
        *,
        since: str = "7d",
        until: str | None = None,
        by: str = "tenant",
        jobs: bool = False,
    ) -> dict[str, Any]:
        """The usage report of ``since`` (a duration before ``until``, or a time) to
        ``until`` (an ISO 8601 time or seconds since the epoch; default now), grouped
        ``by`` tenant, queue, pool, user or type: ``{since, until, by, tenant, rows,
        total, cost_by_tenant, waits, waits_total, wait_histogram, failures,
        interruptions, timeline, records}`` (``records``, one per attempt, with
        ``jobs``)."""
        params: dict[str, str] = {"since": since, "by": by}
        if until is not None:
            params["until"] = until
        if jobs:
            params["jobs"] = "true"
        body: dict[str, Any] = self._request("GET", "/report", params=params)
        return body

    def alerts(
        self,
        *,
        kind: str | None = None,
        job: str | None = None,
        since: float | None = None,
        limit: int = 100,
        after: int | None = None,
    ) -> dict[str, Any]:
        """One page of alerts by id: ``{"alerts": [...], "next_after"}``, each ``{id,
        kind, job, tenant, queue, at, message, detail, delivery, tries, next_try_at,
        delivered_at, last_error}``; ``since`` is seconds since the epoch."""
        given = {"kind": kind, "job": job, "since": since, "after": after}
        params: dict[str, str | int | float] = {"limit": limit}
        params.update({k: v for k, v in given.items() if v is not None})
        body: dict[str, Any] = self._request("GET", "/alerts", params=params)
        return body

    def health(self) -> dict[str, Any]:
        body: dict[str, Any] = self._request("GET", "/healthz")
        return body
