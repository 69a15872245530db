"""One scheduling cycle: ``schedule_once(snapshot) -> Decisions``.

Pure: no clock (``now`` is in the snapshot), no I/O. The phases:

1. **state** — free capacity per node and quota usage per queue from the snapshot;
2. **lines** — each leaf queue's pending jobs in order; closed queues (time windows)
   and unknown queues answered at once;
3. **nominated** — jobs whose victims are still terminating keep their capacity; those
   whose victims are gone, then jobs just moved, are tried first;
4. **order → nominate → admit or preempt** — queue heads in priority, then the
   policy's order; each head is tried in its pools (quota, then placement), else
   preemption, else it waits and may get a backfill reservation; whether the jobs
   behind a waiting head are tried depends on the policy and the queue;
5. **the rest** — every job not looked at gets a reason (what it is behind).

Where the policies differ -- the order across queues, who may be a victim, what quota a
queue may use, who gets a reservation, and what ends a queue's line -- the cycle asks
the state's :class:`~allotment.scheduler.policy.Rules` and reads no switch itself.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from allotment.domain.cluster import PriorityClass, Queue
from allotment.domain.durations import next_window_open, window_open
from allotment.domain.reasons import Reason, ReasonCode
from allotment.scheduler import ordering
from allotment.scheduler.backfill import Reservations
from allotment.scheduler.borrower_turn import BorrowerTurn
from allotment.scheduler.decisions import Admit, Decisions, Preempt
from allotment.scheduler.gates import Gates
from allotment.scheduler.lines import (
    Line,
    Outcome,
    QueueLine,
    Reach,
    behind,
    closed_until,
    group_lines,
    not_a_leaf,
    uses_depth,
)
from allotment.scheduler.placement import PlacementResult
from allotment.scheduler.policy import Rules
from allotment.scheduler.pool_tries import PoolTries
from allotment.scheduler.preemption import (
    VictimPlan,
    describe,
    find_victims,
    held_for_preemptor,
    plan_victims,
    preemptor_claim,
    victim_candidates,
    waiting_for,
)
from allotment.scheduler.quota import QuotaCheck
from allotment.scheduler.snapshot import PendingJob, Snapshot
from allotment.scheduler.state import MAX_REMEMBERED, CycleState
from allotment.scheduler.verdicts import Verdict, holding, most_relevant, recall, verdict


@dataclass(slots=True)
class _Cycle:
    state: CycleState
    decisions: Decisions
    explain: bool = True
    """Give every pending job a reason and fill ``queue_order`` (off in the replay)."""
    copy_ids: bool = False
    """The lines outlive the cycle (a session): decisions keep copies of their ids."""
    reservations: Reservations = field(default_factory=Reservations)
    taken: set[str] = field(default_factory=set)
    touched: set[str] = field(default_factory=set)
    """Pools where this cycle admitted a job (their verdicts are not reused)."""
    searches: int = 0
    answered: set[str] = field(default_factory=set)
    """Jobs decided before phase 4 (nominated preemptors)."""
    preemptors: list[PendingJob] = field(default_factory=list)
    line_of: dict[str, Line] = field(default_factory=dict)
    gates: Gates = field(init=False)
    pools: PoolTries = field(init=False)
    rules: Rules = field(init=False)
    shares: dict[str, float] = field(default_factory=dict)
    """Each queue's dominant share, as computed this cycle (dropped on an admission)."""
    try_orders: dict[tuple[str, ...], list[str]] = field(default_factory=dict)
    """The order a queue's jobs try pools in, per the pools open to them, as worked out
    since the last admission (it follows free capacity)."""
    reach: Reach = field(default_factory=Reach)
    """How far the lines were looked at (for a session's quiet cycles)."""
    examined: int = 0
    truncated: bool = False
    """A per-cycle bound stopped the cycle short: another cycle may do more."""
    past_block: int = 0
    """Jobs looked at, across all queues, that did not start."""
    failed: dict[str, tuple[Outcome, Reason | None]] = field(default_factory=dict)
    """Tries that failed this cycle without a reservation, by what decides them
    (:meth:`PendingJob.asks`)."""
    turns: BorrowerTurn = field(init=False)

    def __post_init__(self) -> None:
        self.gates = Gates(self.state)
        self.pools = PoolTries(self.state, remember=not self.explain)
        self.rules = self.state.rules
        self.turns = BorrowerTurn(self.line_of)

    # ------------------------------------------------------------ phase 2

    def lines(
        self, queues: Mapping[str, QueueLine], preemptors: Iterable[PendingJob]
    ) -> list[Line]:
        cluster = self.state.cluster
        now = self.state.now
        waiting = self.decisions.waiting
        order = self.decisions.queue_order
        explain = self.explain
        self.preemptors.extend(preemptors)
        lines = []
        for name, pending in queues.items():
            if not pending.jobs:
                continue
            ids = pending.ids
            if explain:
                order[name] = list(ids) if self.copy_ids else ids
            queue = cluster.queues.get(name)
            if queue is None or not queue.is_leaf:
                self.reach.closed.add(name)
                if explain:
                    waiting.add_run(order[name], not_a_leaf(cluster, name))
                continue
            if not window_open(queue.time_windows, now):
                self.reach.closed.add(name)
                opens = next_window_open(queue.time_windows, now)
                self.wake_at(opens)
                if explain:
                    waiting.add_run(order[name], closed_until(name, opens, now))
                continue
            line = Line(
                queue=queue,
                jobs=pending.jobs,
                values=pending.values,
                ids=ids,
                ends=self.rules.line.ends(queue),
            )
            self.line_of[name] = line
            lines.append(line)
        return lines

    def wake_at(self, at: float | None) -> None:
        """Something gated by time (a window, a back-off) changes at ``at``."""
        if at is None or at <= self.state.now:
            return
        current = self.decisions.next_wakeup
        if current is None or at < current:
            self.decisions.next_wakeup = at

    # ------------------------------------------------------------ phase 3

    def nominated(self) -> None:
        """Preemptors whose victims are still terminating keep the capacity freed for
        them; those whose victims are gone are tried before anyone else, and then the
        jobs their moves put back in line (on the room left for them)."""
        for job in sorted(self.preemptors, key=lambda p: p.moved):
            line = self.line_of.get(job.queue)
            if line is not None:
                self._nominated_one(line, job)

    def _nominated_one(self, line: Line, job: PendingJob) -> None:
        still = [self.state.holders[v] for v in job.preempting if v in self.state.holders]
        if not still:
            outcome, reason = self._try(job, line)
            if outcome is Outcome.PREEMPTING and reason is not None:
                self.decisions.waiting[job.id] = reason  # it needs more victims
            if outcome in (Outcome.ADMITTED, Outcome.PREEMPTING):
                self.answered.add(job.id)
            else:  # it competes again in phase 4, in its turn
                self.reservations.forget(job.id, self.decisions.reservations)
            return
        pool = still[0].pool
        for holder in still:
            self.state.unhold(holder)
        placed = self.state.placer.place(
            pool,
            job.replicas,
            claims=self.reservations.claims(),
            side=self.state.side(job.queue, pool),
        )
        for holder in still:
            self.state.hold(holder)
        if not placed.ok:
            return  # no longer enough: it competes again in phase 4
        self.reservations.add(held_for_preemptor(job.id, pool, self.state.now, placed, still))
        self.state.quota.claim(job.queue, pool, job.total())
        self.taken.update(h.id for h in still)
        self.answered.add(job.id)
        self.decisions.waiting[job.id] = waiting_for([h.id for h in still], pool)

    # ------------------------------------------------------------ phase 4

    def run(self, lines: list[Line]) -> None:
        heap: list[tuple[ordering.QueueKey, int]] = []
        for i, line in enumerate(lines):
            if self._skip_answered(line):
                heapq.heappush(heap, (self._key(line), i))
        pop, pushpop, turn, key = heapq.heappop, heapq.heappushpop, self._turn, self._key
        item = pop(heap) if heap else None
        while item is not None:  # a line that stays first goes on past the heap (pushpop)
            line = lines[item[1]]
            turn(line)
            if not line.done and self._skip_answered(line) and not self._settle_tail(line):
                item = pushpop(heap, (key(line), item[1]))
            else:
                item = pop(heap) if heap else None

    def _turn(self, line: Line) -> None:
        """Try the job at the line's index (or take what a try of a job asking the same
        answered this cycle) and account for the outcome."""
        job = line.jobs[line.index]
        if job.not_before is not None:  # a back-off gate is the job's own
            outcome, reason = self._try(job, line, defer=True)
        else:
            memo = job.asks()
            known = self.failed.get(memo)
            if known is not None:
                outcome, reason = known
            else:
                outcome, reason = self._try(job, line, defer=True)
                if (
                    outcome is Outcome.QUOTA or outcome is Outcome.CAPACITY
                ) and job.id not in self.decisions.reservations:
                    self.failed[memo] = (outcome, reason)
        self._account(line, job, outcome, reason)

    def _settle_tail(self, line: Line) -> bool:
        """When every job the line has left to look at this cycle takes an answer already
        given to a job asking the same (their tries change nothing), account for them
        all at once and end the line: their place among the other lines' turns changes
        nothing, as no job of this line comes after them. False (nothing done) when one
        would be tried for real, or when their count would reach the cycle's bound on
        jobs looked at past a block. (Where other lines reach that bound later in the
        cycle, which line is cut first may differ from turn-by-turn order.)"""
        if line.index <= line.unsettled:
            return False  # a job ahead still needs a real try
        jobs, answered, failed = line.jobs, self.answered, self.failed
        policy = self.state.policy
        past, i = line.past_block, line.index
        tail: list[tuple[int, tuple[Outcome, Reason | None], bool]] = []
        while i < len(jobs) and past <= policy.backfill_depth:
            job = jobs[i]
            if not answered or job.id not in answered:
                known = failed.get(job.asks()) if job.not_before is None else None
                if known is None:
                    line.unsettled = i
                    return False
                deep = uses_depth(known[0], job)
                tail.append((i, known, deep))
                if known[0] in line.ends:
                    break
                past += deep
            i += 1
        if self.past_block + len(tail) > policy.max_examined_past_block:
            return False
        if tail:
            self._account_failed(line, tail)
        if not line.done:
            line.index = i  # looked at to its end (past any answered jobs)
        return True

    def _account_failed(
        self, line: Line, tail: list[tuple[int, tuple[Outcome, Reason | None], bool]]
    ) -> None:
        """:meth:`_account` for every job of ``tail`` (indexes, known failures, whether
        each uses depth) at once: only the last can end the line or pass its depth; the
        cycle's bound is not hit."""
        jobs, waiting = line.jobs, self.decisions.waiting
        for index, (_, reason), _ in tail:
            if reason is not None:
                waiting[jobs[index].id] = reason
        self.examined += len(tail)
        last, (outcome, reason), _ = tail[-1]
        line.index = last + 1
        if line.blocker is None:
            line.blocker, line.blocker_reason = jobs[tail[0][0]], tail[0][1][1]
        ends = outcome in line.ends
        waited = tail[:-1] if ends else tail
        self._waited(line, len(waited), sum(deep for _, _, deep in waited))
        if ends:
            line.blocker, line.blocker_reason = jobs[last], reason
            line.done = True

    def _account(
        self, line: Line, job: PendingJob, outcome: Outcome, reason: Reason | None
    ) -> None:
        """Take the outcome of the try of ``job``, the job at the line's index."""
        if outcome is Outcome.DEFERRED:
            return  # its line goes back in the heap as a borrower's, still at it
        self.examined += 1
        if outcome is Outcome.ADMITTED:
            self.shares.pop(line.queue.name, None)
            if line.blocker is not None:
                line.admitted_past_block += 1
        elif reason is not None:
            self.decisions.waiting[job.id] = reason
        line.index += 1
        if outcome in line.ends:
            line.blocker, line.blocker_reason = job, reason
            line.done = True
        elif outcome is Outcome.GATED:
            # A job that cannot be tried at all holds up nobody: it is not a block,
            # only work (bounded across all queues).
            self.past_block += 1
            if self.past_block > self.state.policy.max_examined_past_block:
                line.done = True
                self.truncated = True
        elif outcome is not Outcome.ADMITTED:
            if line.blocker is None:
                line.blocker, line.blocker_reason = job, reason
            self._waited(line, 1, int(uses_depth(outcome, job)))

    def _waited(self, line: Line, count: int, deep: int) -> None:
        """``count`` more jobs of ``line`` wait past its block, ``deep`` of them counted
        toward its depth (:func:`~allotment.scheduler.lines.uses_depth`): past its depth
        the line ends (when jobs were admitted past the block, the next cycle looks
        deeper), and past the bound on all of them across all queues the cycle stops."""
        line.past_block += deep
        self.past_block += count
        policy = self.state.policy
        if line.past_block > policy.backfill_depth:
            line.done = True
            if line.admitted_past_block:
                self.truncated = True
        elif self.past_block > policy.max_examined_past_block:
            line.done = True
            self.truncated = True

    def _skip_answered(self, line: Line) -> bool:
        """Move past jobs answered in phase 3; whether a job is left to try."""
        if self.answered:
            while line.index < len(line.jobs) and line.jobs[line.index].id in self.answered:
                line.index += 1
        return line.index < len(line.jobs)

    def _key(self, line: Line) -> ordering.QueueKey:
        """The heap key of the job at the line's index (whether it would borrow wherever
        it may run is kept until the queue's guaranteed usage changes)."""
        job = line.jobs[line.index]
        name = line.queue.name
        state = self.state
        memo = (name, job.shape(), job.pools)
        version = state.quota.guaranteed_version.get(name, 0)
        known = state.borrows.get(memo)
        if known is not None and known[0] == version:
            borrows = known[1]
        else:
            if line.pools is None:
                self._open_pools(line)
            borrows = self.rules.quota.borrows(state.quota, name, job, job.pools or line.own)
            if len(state.borrows) >= MAX_REMEMBERED:
                state.borrows.clear()  # memory stays bounded
            state.borrows[memo] = version, borrows
        if self.turns.deferred and job.id in self.turns.deferred:
            borrows = True
        return self.rules.order.key(
            job, line.values[line.index], name, borrows, state.now, self._share
        )

    def _share(self, queue: str) -> float:
        """The queue's weighted dominant-resource share (computed once per admission)."""
        share = self.shares.get(queue)
        if share is None:
            share = self.shares[queue] = self.state.quota.dominant_share(queue)
        return share

    def _open_pools(self, line: Line, job: PendingJob | None = None) -> list[str]:
        """Where the queue's jobs are tried (a job naming its pools: every pool open to
        the queue, so that one it may not use is answered with why)."""
        if line.pools is None:
            cache = self.state.capacity_cache
            key = ("pools", line.queue.name)
            known = cache.get(key)
            if known is None:
                allowed = self.state.cluster.allowed_pools(line.queue)
                pools, guaranteed = self.rules.quota.pools(line.queue, allowed)
                known = cache[key] = (allowed, pools, pools[:guaranteed])
            line.allowed, line.pools, line.own = known
        if job is not None and job.pools:
            assert line.allowed is not None
            return line.allowed
        return line.pools

    def _try(
        self, job: PendingJob, line: Line, *, defer: bool = False
    ) -> tuple[Outcome, Reason | None]:
        queue = line.queue
        gate, klass, pools = self.gates.check(job, line.queue, self._open_pools(line, job))
        if gate is not None or klass is None:
            if job.not_before is not None:
                self.wake_at(job.not_before)
            return Outcome.GATED, gate
        state = self.state
        if not job.pools:
            memo = (line.queue.name, *pools)
            ordered = self.try_orders.get(memo)
            if ordered is None:
                ordered = self.try_orders[memo] = self.rules.quota.try_order(
                    state.placer, line.own, pools
                )
            pools = ordered
        claims = self.reservations.claims_for(state.now, job.runtime_bound)
        shape = job.shape()
        reasons: list[Reason] = []
        held_back: list[str] = []
        # Without explanations, reservations or victims taken this cycle, a job of the
        # same queue, class and shape that failed in a pool fails there the same way
        # while its verdict holds (see verdicts.py).
        reuse = not self.explain and not self.reservations.items and not self.taken
        verdicts = recall(state, (queue.name, klass.value, shape), MAX_REMEMBERED) if reuse else {}
        known: dict[str, Verdict] = {}
        touched, verdict_of = self.touched, verdicts.get
        for pool in pools:
            mine = reuse and pool not in touched
            if mine:
                held = holding(state, verdict_of(pool), queue.name, pool, job)
                if held is not None:
                    reasons.append(held.reason)
                    known[pool] = verdicts[pool] = held
                    continue
            failed = self.pools.attempt(job, queue.name, pool, shape, claims, held_back)
            if not isinstance(failed, Reason):
                if defer and self.turns.defers(state, self.rules.quota, job, line, pool):
                    return Outcome.DEFERRED, None
                kept = self._kept(queue.name, pool, job.total())
                if kept is not None:
                    reasons.append(kept)
                    reuse = False  # victims were taken: no verdicts
                    continue
                self._admit(job, queue, klass, pool, *failed)
                return Outcome.ADMITTED, None
            reasons.append(failed)
            if mine:
                known[pool] = verdicts[pool] = verdict(state, queue.name, pool, failed)
        if not held_back and self.rules.victims.may_preempt(klass):
            for pool in pools:
                held = known.get(pool)
                if held is not None and held.searched:
                    continue  # its victim search failed and the pool has not changed
                version = len(self.reservations.items)
                tried = self.pools.search(queue.name, pool, klass.value, shape, claims, version)
                if self.pools.searched(tried, pool):
                    continue
                if self.searches >= state.policy.preemption_searches:
                    self.truncated = True
                    break
                self.searches += 1
                found = None
                if held is None or not held.empty:
                    found = victim_candidates(state, job, queue, pool, klass, self.taken)
                plan = (
                    None if found is None else plan_victims(state, job, queue, pool, found, claims)
                )
                if plan is not None:
                    return Outcome.PREEMPTING, self._preempt(job, queue, klass, pool, plan)
                self.pools.search_failed(tried, pool, remember=not self.taken)
                if held is not None and not self.taken:
                    held.searched, held.empty = True, found is None
        if held_back:
            return Outcome.CAPACITY, self.reservations.held_back(held_back[0], queue.name)
        reason = most_relevant(reasons)
        if reason.code is ReasonCode.QUOTA_EXHAUSTED:
            return Outcome.QUOTA, reason
        if self.rules.victims.may_preempt(klass):
            self.turns.stuck(state, self.rules.victims, job, line, klass, pools)
        reservation = self.rules.reservations.reserve(
            state, job, queue.name, pools, len(self.decisions.reservations)
        )
        if reservation is not None:
            self.reservations.add(reservation)
            self.decisions.reservations[job.id] = reservation.start
        else:
            ripe = self.rules.reservations.ripe_at(job)
            if ripe is not None and ripe > state.now:
                current = self.reach.ripe_at
                self.reach.ripe_at = ripe if current is None else min(current, ripe)
        return Outcome.CAPACITY, reason

    def _kept(self, queue: str, pool: str, total: dict[str, int]) -> Reason | None:
        """Why a fitting ``total`` job of ``queue`` waits: an owner made room in ``pool``."""
        state, turns = self.state, self.turns
        for job, line, klass in turns.owners_first(state, queue, pool, total):
            claims = self.reservations.claims_before(job.id, state.now, job.runtime_bound)
            plan = find_victims(state, job, line.queue, pool, klass, self.taken, claims, True)
            if plan is not None:
                self.reservations.forget(job.id, self.decisions.reservations)
                self.decisions.waiting[job.id] = self._preempt(job, line.queue, klass, pool, plan)
                turns.keep(pool, line.queue.name, job.id)
        return turns.kept_for(state, pool, queue, total)

    def _admit(
        self,
        job: PendingJob,
        queue: Queue,
        klass: PriorityClass,
        pool: str,
        placed: PlacementResult,
        check: QuotaCheck,
    ) -> None:
        state = self.state
        borrowed = dict(job.total() if klass.borrow_only else check.borrowed)
        lenders = state.quota.lenders(queue.name, pool, borrowed) if borrowed else ()
        runtime = job.expected_runtime if job.expected_runtime is not None else job.max_runtime
        holder = state.new_holder(
            job_id=job.id,
            queue=queue.name,
            pool=pool,
            klass=klass,
            placements=placed.placements,
            total=job.total(),
            runtime=runtime,
            submit_time=job.submit_time,
        )
        state.hold(holder)
        self.touched.add(pool)
        self.try_orders.clear()
        self.decisions.admitted.append(
            Admit(
                job=job.id,
                queue=queue.name,
                pool=pool,
                placements=placed.placements,
                borrowed=borrowed,
                lenders=lenders,
                backfilled=bool(self.reservations.items),
            )
        )

    def _preempt(
        self, job: PendingJob, queue: Queue, klass: PriorityClass, pool: str, plan: VictimPlan
    ) -> Reason:
        victims = tuple(describe(h, cause, job, klass, pool) for h, cause in plan.victims)
        holders = [h for h, _ in plan.victims]
        self.taken.update(h.id for h in holders)
        self.reservations.add(
            held_for_preemptor(job.id, pool, self.state.now, plan.placement, holders)
        )
        self.state.quota.claim(queue.name, pool, preemptor_claim(job, queue.name, plan))
        reason = waiting_for([v.job for v in victims], pool, sorted({v.cause for v in victims}))
        self.decisions.preemptions.append(
            Preempt(job=job.id, queue=queue.name, pool=pool, victims=victims, reason=reason)
        )
        return reason


def run_cycle(
    state: CycleState,
    queues: Mapping[str, QueueLine],
    preemptors: Iterable[PendingJob],
    *,
    explain: bool = True,
    copy_ids: bool = False,
    reach: Reach | None = None,
) -> Decisions:
    """Phases 2 to 5 on a prepared state (phase 1); admissions stay held in ``state``.
    ``reach``, when given, is filled with how far the lines were looked at."""
    decisions = Decisions(now=state.now)
    cycle = _Cycle(state=state, decisions=decisions, explain=explain, copy_ids=copy_ids)
    lines = cycle.lines(queues, preemptors)  # 2. lines
    cycle.nominated()  # 3. nominated
    cycle.run(lines)  # 4. order → nominate → admit / preempt / wait
    if reach is not None:
        for line in lines:
            if line.done and line.index < len(line.jobs):
                cycle.reach.stopped[line.queue.name] = line.index
        reach.stopped, reach.closed, reach.ripe_at = (
            cycle.reach.stopped,
            cycle.reach.closed,
            cycle.reach.ripe_at,
        )
    if explain:  # 5. the rest
        for tail, reason in behind(lines, cycle.answered):
            decisions.waiting.add_run(tail, reason)
    state.quota.drop_claims()
    decisions.stats = {
        "examined": cycle.examined,
        "admitted": len(decisions.admitted),
        "preemptions": len(decisions.preemptions),
        "reservations": len(cycle.reservations.items),
        "truncated": cycle.truncated,
    }
    return decisions


def schedule_once(snapshot: Snapshot) -> Decisions:
    """Decide, for every pending job, admit (with placement and borrowed part), preempt
    (with victims and cause) or wait (with a reason). Pure and deterministic."""
    state = CycleState.from_snapshot(snapshot)  # 1. state
    classes = {name: c.value for name, c in snapshot.cluster.priority_classes.items()}
    queues, preemptors = group_lines(snapshot.pending, classes)
    return run_cycle(state, queues, preemptors)
