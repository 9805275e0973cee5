"""What of the sidecar's environment a locally started trainer may see.

In a pod the trainer has its own container and environment. Locally the launcher is the sidecar's
child, so without this the trainer would inherit the sidecar's S3 credentials (with which it could
delete its deadline record) and its kubeconfig. Pure: the environment is an argument.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# The sidecar's settings (the trainer gets its own SOAK_* variables from go.json), its S3
# credentials and configuration (boto3 reads AWS_*), and its Kubernetes credentials. Compared in
# lower case, the fold pydantic-settings reads names with: soak_s3__endpoint_url is a setting too,
# and so is a name spelt with U+212A KELVIN SIGN for its K, which upper-casing would miss. Any case
# of the others is as much a credential to whoever reads it.
WITHHELD_PREFIXES = ("soak_", "aws_")
WITHHELD_NAMES = frozenset({"kubeconfig", "boto_config"})


def withheld(name: str) -> bool:
    folded = name.lower()
    return folded in WITHHELD_NAMES or folded.startswith(WITHHELD_PREFIXES)


def trainer_environment(environ: Mapping[str, str], keep: Iterable[str] = ()) -> dict[str, str]:
    """``environ`` without the sidecar's settings and credentials, in any case, except the names in
    ``keep`` (exactly as spelt: keeping AWS_PROFILE keeps no aws_profile)."""
    kept = frozenset(keep)
    return {name: value for name, value in environ.items() if name in kept or not withheld(name)}
