"""Allotment: multi-tenant scheduling and governance for scarce AI compute."""

__version__ = "0.1.0"
