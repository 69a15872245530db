"""Delivering alerts to their tenants' webhooks, on a thread of its own.

Every server runs one :class:`WebhookDeliveries` (leader or not): the scheduler only
inserts alert rows, and this worker POSTs each due one. Rows are claimed with a lease
(:func:`~allotment.store.alerts.claim_delivery`), so several servers on one store
never try the same alert at once; a worker that dies mid-call leaves its lease to
expire and the try is made again (delivery is at least once: receivers should key on
the ``X-Allotment-Alert`` header or the body's ``id``).

A try is ``POST <url>`` with the JSON of :func:`payload`, ``Content-Type:
application/json``, ``X-Allotment-Alert: <id>``, and, when the tenant's webhook has a
``secret``, ``X-Allotment-Signature: sha256=<hex HMAC-SHA256 of the body>``. A 2xx
answer delivers it; anything else (another status, a timeout, no connection) is retried
after ``base_delay_s * 2**(tries-1)`` (at most ``max_delay_s``), until ``max_tries``
tries have failed: then the alert is ``failed``. Each try's error is kept in
``last_error``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import sessionmaker

from allotment.domain.cluster import Cluster
from allotment.store.alerts import claim_delivery, due_deliveries, finish_delivery
from allotment.store.models import Alert

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Allotment-Signature"
ALERT_HEADER = "X-Allotment-Alert"
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MAX_TRIES = 8
DEFAULT_BASE_DELAY_S = 5.0
DEFAULT_MAX_DELAY_S = 600.0
DEFAULT_POLL_S = 1.0
ERROR_CAP = 500


def payload(alert: Alert) -> dict[str, Any]:
    """The JSON body of an alert's webhook call."""
    return {
        "id": alert.id,
        "kind": alert.kind,
        "at": datetime.fromtimestamp(alert.at, UTC).isoformat().replace("+00:00", "Z"),
        "tenant": alert.tenant,
        "queue": alert.queue,
        "job": alert.job_id,
        "message": alert.message,
        "detail": dict(alert.detail or {}),
    }


def signature(secret: str, body: bytes) -> str:
    """The ``X-Allotment-Signature`` value of ``body``: ``sha256=`` and the hex digest."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def retry_delay(tries: int, *, base_s: float, max_s: float) -> float:
    """Seconds before the next try after ``tries`` failed ones (``tries >= 1``)."""
    return float(min(max_s, base_s * 2 ** max(0, tries - 1)))


class WebhookDeliveries:
    """POSTs due alerts to their webhooks until :meth:`stop`.

    ``cluster()`` gives the current configuration (for each tenant's ``secret``);
    ``clock`` returns seconds since the epoch. :meth:`deliver_due` makes one pass on the
    caller's thread; :meth:`start` runs passes on a daemon thread every ``poll_s`` or
    when :meth:`wake` is called. Never raises out of its thread.
    """

    def __init__(
        self,
        sessions: sessionmaker[DbSession],
        cluster: Callable[[], Cluster],
        *,
        clock: Callable[[], float] = time.time,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_tries: int = DEFAULT_MAX_TRIES,
        base_delay_s: float = DEFAULT_BASE_DELAY_S,
        max_delay_s: float = DEFAULT_MAX_DELAY_S,
        poll_s: float = DEFAULT_POLL_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if max_tries < 1 or timeout_s <= 0 or poll_s <= 0:
            raise ValueError("max_tries, timeout_s and poll_s must be positive")
        self.sessions = sessions
        self.cluster = cluster
        self.clock = clock
        self.timeout_s = timeout_s
        self.max_tries = max_tries
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s
        self.poll_s = poll_s
        self.lease_s = timeout_s * 3 + 5.0
        """Longer than one try can take: a live worker's lease never expires under it."""
        self._http = httpx.Client(
            timeout=timeout_s, transport=transport, follow_redirects=False, trust_env=False
        )
        self._woken = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.tries = 0
        """Calls made since start (for tests and health checks)."""

    # ------------------------------------------------------------------ thread

    def start(self) -> None:
        """Start the thread (once). Does not block."""
        if self._thread is not None:
            raise RuntimeError("the webhook deliveries have already started")
        self._thread = threading.Thread(target=self._run, name="allotment-webhooks", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Look for due alerts now. Never blocks."""
        self._woken.set()

    def stop(self, timeout: float | None = None) -> None:
        """Stop after the current try; blocks until the thread has ended (or
        ``timeout``, by default one try's)."""
        self._stopping.set()
        self._woken.set()
        if self._thread is not None:
            self._thread.join(self.timeout_s + 5.0 if timeout is None else timeout)
        self._http.close()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._woken.clear()
            try:
                self.deliver_due()
            except Exception:  # the store may be briefly unreachable: try again later
                log.exception("webhook delivery pass failed")
            self._woken.wait(self.poll_s)

    # ------------------------------------------------------------------ one pass

    def deliver_due(self) -> int:
        """Try every alert due now once; return how many tries were made."""
        with self.sessions() as db:
            due = [alert.id for alert in due_deliveries(db, now=self.clock())]
        made = 0
        for alert_id in due:
            if self._stopping.is_set():
                break
            if self._try(alert_id):
                made += 1
        return made

    def _try(self, alert_id: int) -> bool:
        """Claim, call and record one try of alert ``alert_id``; ``False`` when another
        worker holds it."""
        with self.sessions.begin() as db:
            alert = db.get(Alert, alert_id)
            if alert is None or alert.webhook is None:
                return False
            lease = claim_delivery(db, alert, now=self.clock(), lease_s=self.lease_s)
            if lease is None:
                return False
            url, tries, tenant = alert.webhook, alert.tries + 1, alert.tenant
            body = json.dumps(payload(alert), separators=(",", ":"), sort_keys=True).encode()
        error = self._post(url, body, alert_id, self._secret(tenant))
        self.tries += 1
        now = self.clock()
        retry_at = None
        if error is not None and tries < self.max_tries:
            retry_at = now + retry_delay(tries, base_s=self.base_delay_s, max_s=self.max_delay_s)
        with self.sessions.begin() as db:
            held = finish_delivery(
                db,
                alert_id,
                lease=lease,
                delivered_at=now if error is None else None,
                error=error,
                retry_at=retry_at,
            )
        if not held:
            log.warning("alert %s: the delivery lease expired during the call", alert_id)
        elif error is not None:
            log.warning("alert %s: webhook try %d failed: %s", alert_id, tries, error)
        return True

    def _secret(self, tenant: str | None) -> str | None:
        if tenant is None:
            return None
        found = self.cluster().tenants.get(tenant)
        if found is None or found.webhook is None:
            return None
        return found.webhook.secret

    def _post(self, url: str, body: bytes, alert_id: int, secret: str | None) -> str | None:
        """POST ``body``; ``None`` on a 2xx answer, else what went wrong."""
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "allotment-webhook/1",
            ALERT_HEADER: str(alert_id),
        }
        if secret is not None:
            headers[SIGNATURE_HEADER] = signature(secret, body)
        try:
            response = self._http.post(url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"[:ERROR_CAP]
        if response.is_success:
            return None
        return f"HTTP {response.status_code}"
