"""A throwaway PKI for test control planes: a CA, leaf certificates it signs, a service-account key."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

DAYS = "3"
# How far back certificates are made valid when a clock shim is given: a client whose wall clock is
# set back (tests/clockshim) still trusts them, as it would a real cluster's older certificates.
BACKDATE_S = 86400


def _openssl(*args: str | Path, clockshim: Path | None = None) -> None:
    env = None
    if clockshim is not None:
        env = {**os.environ, "LD_PRELOAD": str(clockshim), "CLOCKSHIM_OFFSET_S": str(-BACKDATE_S)}
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, env=env)


def make_pki(pki: Path, leaves: Mapping[str, tuple[str, str]], *, clockshim: Path | None = None) -> None:
    """``ca.crt``/``ca.key``, ``<name>.crt``/``<name>.key`` for each leaf (subject, x509v3 extension
    lines), and ``sa.key``/``sa.pub`` for signing service-account tokens. With ``clockshim`` the
    certificates are valid from BACKDATE_S ago."""
    pki.mkdir(parents=True)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        DAYS,
        "-keyout",
        pki / "ca.key",
        "-out",
        pki / "ca.crt",
        "-subj",
        "/CN=soak-test-ca",
        clockshim=clockshim,
    )
    for name, (subject, extensions) in leaves.items():
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            pki / f"{name}.key",
            "-out",
            pki / f"{name}.csr",
            "-subj",
            subject,
        )
        ext = pki / f"{name}.ext"
        ext.write_text(extensions + "keyUsage=digitalSignature,keyEncipherment\n", encoding="utf-8")
        _openssl(
            "x509",
            "-req",
            "-in",
            pki / f"{name}.csr",
            "-CA",
            pki / "ca.crt",
            "-CAkey",
            pki / "ca.key",
            "-CAcreateserial",
            "-days",
            DAYS,
            "-extfile",
            ext,
            "-out",
            pki / f"{name}.crt",
            clockshim=clockshim,
        )
    _openssl("genrsa", "-out", pki / "sa.key", "2048")
    _openssl("rsa", "-in", pki / "sa.key", "-pubout", "-out", pki / "sa.pub")
