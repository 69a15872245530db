"""GPU telemetry: where readings come from (:mod:`.sources`) and how samples are
aggregated per interval (:mod:`.aggregate`). Imports only the domain."""
