"""What of the sidecar's environment a locally started trainer may see.

In a pod the trainer has its own container and environment. Locally the launcher is the sidecar's
child, so without this the trainer would inherit the sidecar's S3 credentials (with which it could
delete its deadline record) and its kubeconfig. Pure: the environment is an argument.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# The sidecar's settings (the trainer gets its own SOAK_* variables from go.json), its S3
# credentials and configuration, and its Kubernetes credentials.
WITHHELD_PREFIXES = ("SOAK_", "AWS_")
WITHHELD_NAMES = frozenset({"KUBECONFIG", "BOTO_CONFIG"})


def withheld(name: str) -> bool:
    return name in WITHHELD_NAMES or name.startswith(WITHHELD_PREFIXES)


def trainer_environment(environ: Mapping[str, str], keep: Iterable[str] = ()) -> dict[str, str]:
    """``environ`` without the sidecar's settings and credentials, except the names in ``keep``."""
    kept = frozenset(keep)
    return {name: value for name, value in environ.items() if name in kept or not withheld(name)}
