"""Prometheus metrics while the sidecar runs: the registry and what feeds it (``prometheus``), and
the HTTP server of ``/metrics``, bounded against clients in the trainer's network namespace
(``server``)."""

from sidecar.adapters.metrics.prometheus import PrometheusMetrics

__all__ = ["PrometheusMetrics"]
