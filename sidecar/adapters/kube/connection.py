"""An ApiClient from an explicit host+token, a kubeconfig or the environment; the default namespace."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.config.config_exception import ConfigException

from sidecar.core.errors import ConfigError

_SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def connect(
    *,
    kubeconfig: Path | None = None,
    host: str | None = None,
    token: str | None = None,
    ca_file: Path | None = None,
    prefer_in_cluster: bool = True,
) -> k8s.ApiClient:
    """An ApiClient from, in order: an explicit host+token, ``kubeconfig``, then the environment.

    Without either, ``prefer_in_cluster`` tries the pod's service account first (the sidecar)
    and the default kubeconfig second; otherwise the other way round (the verdict CLI).
    In-cluster tokens are re-read as the kubelet rotates them.
    """
    cfg = k8s.Configuration()
    try:
        if host is not None:
            if token is None:
                raise ConfigError("an explicit API host needs a token")
            cfg.host = host
            # The key's name changed in client 36 ("authorization" -> "BearerToken"), and the
            # prefix is looked up under the new name only: set the whole header value under both.
            cfg.api_key = {"authorization": f"Bearer {token}", "BearerToken": f"Bearer {token}"}
            if ca_file is not None:
                cfg.ssl_ca_cert = str(ca_file)
        elif kubeconfig is not None:
            k8s_config.load_kube_config(
                config_file=str(kubeconfig), client_configuration=cfg, persist_config=False
            )
        else:
            loaders: list[Callable[[], None]] = [
                lambda: k8s_config.load_incluster_config(client_configuration=cfg),
                lambda: k8s_config.load_kube_config(client_configuration=cfg, persist_config=False),
            ]
            if not prefer_in_cluster:
                loaders.reverse()
            _first_that_loads(loaders)
    except (ConfigException, OSError, ValueError) as exc:
        raise ConfigError(f"no usable Kubernetes configuration: {exc}") from exc
    # Our own retry loop decides about retries; urllib3's hidden ones would multiply it.
    cfg.retries = 0
    return k8s.ApiClient(cfg)


def default_namespace(kubeconfig: Path | None = None) -> str:
    """The kubeconfig context's namespace, else the pod's own (in-cluster), else ``default``."""
    try:
        _, context = k8s_config.list_kube_config_contexts(config_file=str(kubeconfig) if kubeconfig else None)
        namespace = (context.get("context") or {}).get("namespace")
        if namespace:
            return str(namespace)
    except (ConfigException, OSError, ValueError, TypeError):
        pass
    try:
        return Path(_SA_NAMESPACE_FILE).read_text(encoding="utf-8").strip() or "default"
    except OSError:
        return "default"


def _first_that_loads(loaders: list[Callable[[], None]]) -> None:
    errors: list[str] = []
    for load in loaders:
        try:
            load()
            return
        except (ConfigException, OSError, ValueError) as exc:
            errors.append(str(exc))
    raise ConfigException("; ".join(errors))
