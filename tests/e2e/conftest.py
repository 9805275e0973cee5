"""The e2e cluster: ``SOAK_E2E=node`` (a real single node built here; what CI runs, as root) or
``SOAK_E2E=kind`` (Docker and kind). Unset, the e2e tests skip; set, a cluster that cannot start is
an error, never a skip. One cluster serves the e2e package and is gone before the other tests run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.providers import E2ECluster, e2e_cluster, selected_provider
from tests.fixtures.helm import layer_tools_dir


@pytest.fixture(scope="package")
def e2e(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2ECluster]:
    provider = selected_provider()
    if provider is None:
        pytest.skip("opt-in: SOAK_E2E=node (a real single node, as root) or SOAK_E2E=kind (Docker and kind)")
    with e2e_cluster(provider, tmp_path_factory.mktemp("e2e"), layer_tools_dir()) as cluster:
        yield cluster
