"""The e2e cluster: ``SOAK_E2E=node`` (a real single node built here; what CI runs, as root) or
``SOAK_E2E=kind`` (Docker and kind). Unset, the e2e tests skip; set, a cluster that cannot start is
an error, never a skip. One cluster serves the e2e package and is gone before the other tests run;
the real node's teardown, and kind's with its own dockerd (SOAK_KIND_NODE=local), must leave the
host as it found it (checked here; what other real nodes up meanwhile and other runs' processes
own is left out of the comparison).

With ``SOAK_E2E_ONCE=1`` (.ci/run, which brings up both clusters) each scenario runs on one of them
only, the one that shows it best (``KIND_SCENARIOS``; docs/helm.md says why); the others are
deselected, not skipped. Unset, every scenario runs on the cluster ``SOAK_E2E`` names."""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.cluster import kind
from tests.cluster.hostshare import HOST_PATHS, REGISTRY, LiveNodes
from tests.cluster.images import DOCKER_PATHS
from tests.cluster.providers import E2ECluster, e2e_cluster, selected_provider
from tests.cluster.system import boot_clock, command_line_places, foreign_pids, host_state
from tests.fixtures.helm import layer_tools_dir

# What a user runs on kind with the chart's kind values: the docs' commands, a passing soak, the mock
# NVML's GPU fault and its retry, the torch DDP pair through extraMounts, and an OOM kill inside kind's
# nested containers. Everything else runs on the real node, where the kubelet and containerd are the
# hosts' own (a faster cluster, and the one the disruption and early-exit scenarios were built on).
KIND_SCENARIOS = frozenset(
    {
        "test_docs_cluster_commands_as_written",
        "test_passing_soak",
        "test_gpu_fault_retries_on_the_same_deadline",
        "test_two_pods_form_one_torch_ddp_group_and_pass",
        "test_out_of_memory_names_the_limit",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    provider = selected_provider()
    if os.environ.get("SOAK_E2E_ONCE") != "1" or provider is None:
        return
    elsewhere = [
        item
        for item in items
        if item.get_closest_marker("e2e")
        and ("kind" if getattr(item, "originalname", item.name) in KIND_SCENARIOS else "node") != provider
    ]
    if elsewhere:
        config.hook.pytest_deselected(items=elsewhere)
        items[:] = [item for item in items if item not in elsewhere]


@pytest.fixture(scope="package")
def e2e(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2ECluster]:
    provider = selected_provider()
    if provider is None:
        pytest.skip("opt-in: SOAK_E2E=node (a real single node, as root) or SOAK_E2E=kind (Docker and kind)")
    watched = [*HOST_PATHS, REGISTRY, *DOCKER_PATHS, kind.DOCKER_EXEC_ROOT]
    since = boot_clock()
    before = _host_state_but_others(watched, since)
    with e2e_cluster(provider, tmp_path_factory.mktemp("e2e"), layer_tools_dir()) as cluster:
        yield cluster
    if provider == "node" or kind.local_node():
        left = sorted(_host_state_but_others(watched, since) - before)
        assert not left, f"the {provider} cluster's teardown left these behind: {left}"


def _host_state_but_others(watched: list[Path], since: float) -> set[str]:
    """The host's state less what belongs to others on this machine: real nodes up now (another test
    run's, or one brought up by hand: tests.cluster.hostshare), and the processes of other runs (and
    mounts under the places their command lines name), so what they start or stop meanwhile is not
    taken for this run's leftovers."""
    nodes = LiveNodes.now()
    others = nodes.pids() | foreign_pids(since)
    places = command_line_places(others)
    return {
        item
        for item in host_state(watched, skip_pids=others)
        if not nodes.owns(item) and not _mounted_under(item, places)
    }


def _mounted_under(item: str, places: set[Path]) -> bool:
    kind_, _, where = item.partition(" ")
    return kind_ == "mount" and any(Path(where).is_relative_to(place) for place in places)


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
