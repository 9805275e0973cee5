"""What an S3-compatible store must do for the sidecar's promises to hold, and the decision on a
store that was probed (``sidecar.adapters.s3_store.probe``). Pure.

Every promise across attempts rests on conditional writes: one supervisor per run (the lease is
created with ``If-None-Match: *``, renewed and released with ``If-Match``), attempt numbers never
reused (each claim a conditional create), evidence never rewritten (every object a conditional
create, multipart uploads completed with ``If-None-Match: *``) and no ledger entry lost (the ledger
folded with ``If-Match``). A store that ignores them gives none of that, so it is refused before a
trainer starts. The SHA-256 the sidecar sends with every upload is what makes an upload verified:
a store that neither checks it nor says it did is refused too, unless the operator accepts that
(``s3.accept_unverified_checksums``), and then every upload is recorded as unverified.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StoreFeatures:
    """What one probe of a store found; each True when the store behaved as S3 does."""

    endpoint: str
    bucket: str
    # A second PutObject with If-None-Match: * on the key was refused (412).
    conditional_create: bool
    # PutObject with a wrong If-Match was refused (412).
    conditional_put: bool
    # DeleteObject with a wrong If-Match was refused (412).
    conditional_delete: bool
    # CompleteMultipartUpload with If-None-Match: * on an existing key was refused (412).
    conditional_complete: bool
    # PutObject with a wrong x-amz-checksum-sha256 was refused (BadDigest and the like).
    checksum_checked: bool
    # PutObject's answer carried the x-amz-checksum-sha256 it was sent.
    checksum_echoed: bool
    # What the probe cost: requests sent, and milliseconds.
    requests: int = 0
    elapsed_ms: float = 0.0

    @property
    def checksums_confirmed(self) -> bool:
        return self.checksum_checked and self.checksum_echoed


# What each conditional write is, in a refusal's words, and what depends on it.
CONDITIONAL_WRITES: tuple[tuple[str, str], ...] = (
    ("conditional_create", "PutObject If-None-Match: *"),
    ("conditional_put", "PutObject If-Match"),
    ("conditional_delete", "DeleteObject If-Match"),
    ("conditional_complete", "CompleteMultipartUpload If-None-Match: *"),
)
DEPENDS_ON_CONDITIONALS = (
    "one supervisor per run, attempt numbers never reused, evidence never overwritten and no ledger "
    "entry lost depend on them"
)
ACCEPT_SETTING = "s3.accept_unverified_checksums (SOAK_S3__ACCEPT_UNVERIFIED_CHECKSUMS)"


def missing_conditionals(found: StoreFeatures) -> list[str]:
    """The conditional writes the store ignored, in the order of ``CONDITIONAL_WRITES``."""
    return [what for name, what in CONDITIONAL_WRITES if not getattr(found, name)]


def store_refusal(found: StoreFeatures, *, accept_unverified: bool) -> str | None:
    """Why the store cannot be trusted with the run (one line), or None."""
    where = f"the S3 store {found.endpoint} (bucket {found.bucket})"
    missing = missing_conditionals(found)
    if missing:
        return (
            f"{where} does not honour conditional writes ({', '.join(missing)} succeeded where it must "
            f"fail with 412): {DEPENDS_ON_CONDITIONALS}; use a store that honours them (docs/helm.md)"
        )
    if found.checksums_confirmed or accept_unverified:
        return None
    lacks = []
    if not found.checksum_checked:
        lacks.append("stored a PutObject whose x-amz-checksum-sha256 did not match its body")
    if not found.checksum_echoed:
        lacks.append("did not echo x-amz-checksum-sha256")
    return (
        f"{where} does not confirm SHA-256 checksums (it {' and '.join(lacks)}): an upload corrupted "
        f"on the way would be recorded as verified; set {ACCEPT_SETTING}=true to use it anyway, "
        "and every upload is then recorded as unverified"
    )
