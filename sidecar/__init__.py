"""soak-sidecar: supervise long-running GPU training soaks from a sidecar."""

__version__ = "0.1.0"
