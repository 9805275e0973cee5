"""Kubernetes API adapter: one module per concern.

``connection`` (an ApiClient from a kubeconfig, host+token or the service account), ``client`` (the
retrying client every call goes through), ``reads`` (the sidecar's own pod; a Job's pods, verdict
Events and conditions as the core's facts), ``publisher`` (the verdict and progress on the pod),
``clock`` (the apiserver's clock) and ``termination`` (the termination message, no API needed).

Every kubernetes/urllib3 error is translated into :class:`sidecar.core.errors.PublishError`
(:class:`sidecar.core.errors.ForbiddenError` for 403) at this boundary. The sidecar's service account
needs only ``pods get/patch`` and ``events create`` in its own namespace (docs/rbac.md).
"""
