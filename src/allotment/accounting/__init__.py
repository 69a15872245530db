"""Usage accounting and reports: GPU-hours allocated, used and idle, CPU and memory
hours, cost, waits, failures, preemptions and reclaims over a time window.

:mod:`~allotment.accounting.figures` and :mod:`~allotment.accounting.waits` are pure
(plain values in, plain values out); :mod:`~allotment.accounting.source` reads the store;
:mod:`~allotment.accounting.report` puts one report together.
"""
