"""SQLite engines: writers of one process take turns through the write gate."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sqlalchemy import text

from allotment.store.db import WriteGate, make_engine


def test_the_gate_is_first_come_first_served_and_reentrant() -> None:
    gate = WriteGate()
    gate.acquire()
    gate.acquire()  # the same thread again
    order: list[int] = []
    started: list[threading.Event] = []
    threads = []
    for i in range(5):
        began = threading.Event()

        def run(i: int = i, began: threading.Event = began) -> None:
            began.set()
            gate.acquire()
            order.append(i)
            gate.release()

        t = threading.Thread(target=run)
        t.start()
        began.wait()
        # let this thread reach the gate before the next one starts
        for _ in range(100):
            if gate._next == i + 2:
                break
            threading.Event().wait(0.01)
        started.append(began)
        threads.append(t)
    gate.release()
    assert order == []  # still held once
    gate.release()
    for t in threads:
        t.join(timeout=10)
    assert order == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("end", ["commit", "rollback", "close"])
def test_a_write_transaction_holds_the_gate_until_it_ends(tmp_path: Path, end: str) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'a.db'}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (x INTEGER)"))
    done = threading.Event()

    def other_writer() -> None:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO t VALUES (2)"))
        done.set()

    conn = engine.connect()
    conn.execute(text("SELECT 1"))  # a read takes no turn
    conn.execute(text("INSERT INTO t VALUES (1)"))
    writer = threading.Thread(target=other_writer)
    writer.start()
    assert not done.wait(0.3)  # waits its turn (not SQLite's busy poll)
    if end == "commit":
        conn.commit()
    elif end == "rollback":
        conn.rollback()
    conn.close()
    assert done.wait(10)
    writer.join()
    with engine.connect() as check:
        rows = sorted(r[0] for r in check.execute(text("SELECT x FROM t")))
    assert rows == ([1, 2] if end == "commit" else [2])
    engine.dispose()
