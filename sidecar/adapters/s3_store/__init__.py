"""Deadline records and the supervisor lock in an S3 bucket (``DeadlineStore``).

Layout under ``s3://<bucket>/<deadline_prefix>/``: ``<run_id>.json`` (the record, created once
with ``If-None-Match: *`` and never rewritten), ``<slot>.lock`` (the supervisor's lease) and
``<slot>.attempts/<n>`` (the attempt ledger); a slot is the run id, or ``<run_id>.index-<n>`` for one
pod of a multi-pod soak (every index shares the run's record).

Lock semantics. S3 has no locks, so the lock is a lease object:

- acquire: PutObject ``If-None-Match: *`` with a fresh owner token. If the lease exists, the
  waiter watches its ETag. A change means a live owner renewing it: ``AlreadySupervisedError``.
  No change for ``lock_lease_s`` on the waiter's own monotonic clock means the owner is gone,
  and the waiter takes the lease over with ``If-Match: <that ETag>`` (at most one taker wins).
  No wall-clock comparison across machines is involved, so clock skew cannot cause a takeover.
  The price: a supervisor replacing a crashed one waits up to ``lock_lease_s``, and a duplicate
  supervisor is refused only once it sees a renewal (up to ``lock_renew_interval_s``).
- hold: a daemon thread renews every ``lock_renew_interval_s`` with ``If-Match`` on the last
  ETag. A 412 (taken over) or no successful renewal for ``lock_lease_s`` counted from the send
  time of the last good one (a waiter may take over from then on) means the lease is lost:
  ``on_lock_lost`` is called once with the reason; the caller must stop the trainer.
- release: DeleteObject ``If-Match: <our ETag>``; a failure leaves a lease that the next
  supervisor takes over after ``lock_lease_s``.

Limits: correctness needs a store that honours ``If-None-Match``/``If-Match`` on PutObject and
DeleteObject (AWS S3, SeaweedFS); a store that silently ignores them gives no mutual exclusion, so
``probe`` checks that before the first lock and the run refuses such a store.
Time spent paused (SIGSTOP, VM freeze) beyond the lease is indistinguishable from a crash.

``records`` holds the store (records, ledger, the server's clock), ``lease`` the lock, ``probe``
what the store honours, ``objects`` what they share.
"""

from sidecar.adapters.s3_store.records import S3DeadlineStore

__all__ = ["S3DeadlineStore"]
