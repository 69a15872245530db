"""Executors: run replicas somewhere and report what they see (see :mod:`.base`)."""
