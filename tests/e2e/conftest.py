"""The e2e cluster: ``SOAK_E2E=node`` (a real single node built here; what CI runs, as root) or
``SOAK_E2E=kind`` (Docker and kind). Unset, the e2e tests skip; set, a cluster that cannot start is
an error, never a skip. One cluster serves the e2e package and is gone before the other tests run;
the real node's teardown, and kind's with its own dockerd (SOAK_KIND_NODE=local), must leave the
host as it found it (checked here)."""

from __future__ import annotations

from collections.abc import Generator, Iterator

import pytest

from tests.cluster import kind
from tests.cluster.images import DOCKER_PATHS
from tests.cluster.node import HOST_PATHS
from tests.cluster.providers import E2ECluster, e2e_cluster, selected_provider
from tests.cluster.system import host_state
from tests.fixtures.helm import layer_tools_dir


@pytest.fixture(scope="package")
def e2e(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2ECluster]:
    provider = selected_provider()
    if provider is None:
        pytest.skip("opt-in: SOAK_E2E=node (a real single node, as root) or SOAK_E2E=kind (Docker and kind)")
    watched = [*HOST_PATHS, *DOCKER_PATHS, kind.DOCKER_EXEC_ROOT]
    before = host_state(watched)
    with e2e_cluster(provider, tmp_path_factory.mktemp("e2e"), layer_tools_dir()) as cluster:
        yield cluster
    if provider == "node" or kind.local_node():
        left = sorted(host_state(watched) - before)
        assert not left, f"the {provider} cluster's teardown left these behind: {left}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed e2e test reports the cluster's Jobs, pods and Events with its failure."""
    report = yield
    cluster = getattr(item, "funcargs", {}).get("e2e")
    if report.failed and call.when == "call" and isinstance(cluster, E2ECluster):
        try:
            state = cluster.state_report()
        except Exception as exc:  # a report must never hide the failure itself
            state = f"no cluster state: {exc!r}"
        report.sections.append(("Cluster state at the failure", state))
    return report
