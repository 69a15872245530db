"""The HTTP API under ``/api/v1``: build it with :func:`allotment.api.app.create_app`."""
