"""What a probed store must honour, and the one line that refuses it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sidecar.core.store_features import StoreFeatures, missing_conditionals, store_refusal

S3 = StoreFeatures(
    endpoint="http://127.0.0.1:9000",
    bucket="soaks",
    conditional_create=True,
    conditional_put=True,
    conditional_delete=True,
    conditional_complete=True,
    checksum_checked=True,
    checksum_echoed=True,
)


def test_a_store_that_honours_everything_is_trusted() -> None:
    assert store_refusal(S3, accept_unverified=False) is None
    assert S3.checksums_confirmed and missing_conditionals(S3) == []


def test_a_store_that_ignores_conditional_writes_is_refused_whatever_is_accepted() -> None:
    ignoring = replace(S3, conditional_create=False, conditional_delete=False)
    for accepted in (False, True):
        refusal = store_refusal(ignoring, accept_unverified=accepted)
        assert refusal is not None and "\n" not in refusal
        assert refusal.startswith(
            "the S3 store http://127.0.0.1:9000 (bucket soaks) does not honour conditional writes "
            "(PutObject If-None-Match: *, DeleteObject If-Match succeeded where it must fail with 412)"
        )
        assert "one supervisor per run, attempt numbers never reused" in refusal


@pytest.mark.parametrize(
    ("checked", "echoed", "said"),
    [
        (False, True, "it stored a PutObject whose x-amz-checksum-sha256 did not match its body"),
        (True, False, "it did not echo x-amz-checksum-sha256"),
        (False, False, "did not match its body and did not echo"),
    ],
)
def test_a_store_that_does_not_confirm_checksums_is_refused_unless_accepted(
    checked: bool, echoed: bool, said: str
) -> None:
    unconfirmed = replace(S3, checksum_checked=checked, checksum_echoed=echoed)
    refusal = store_refusal(unconfirmed, accept_unverified=False)
    assert refusal is not None and said in refusal
    assert "SOAK_S3__ACCEPT_UNVERIFIED_CHECKSUMS" in refusal
    assert store_refusal(unconfirmed, accept_unverified=True) is None
    assert not unconfirmed.checksums_confirmed
