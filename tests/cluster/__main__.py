"""Bring a test cluster up by hand: ``python3 -m tests.cluster prepare|up`` (root; see --help)."""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

from tests.cluster import images
from tests.cluster.node import RealNode
from tests.cluster.system import kube_binaries, log
from tests.fixtures.helm import layer_tools_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m tests.cluster",
        description="The real single-node cluster of the e2e tests (root, Linux). 'prepare' builds or "
        "reuses the Kubernetes binaries and the images (what .ci/run does before the tests); 'up' also "
        "starts the node, prints its kubeconfig path and keeps it up until Ctrl-C, then tears it down.",
    )
    parser.add_argument("action", choices=("prepare", "up"))
    parser.add_argument("--workdir", type=Path, help="Where the node keeps its state (default: a temp dir).")
    args = parser.parse_args(argv)
    started = time.monotonic()
    kube_binaries(node=True)
    images.pause_image()
    images.project_image()
    tools = layer_tools_dir()
    log(f"binaries and images ready in {time.monotonic() - started:.0f} s")
    if args.action == "prepare":
        return 0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="soak-node-"))
    node = RealNode(workdir=workdir, kubectl_bin=tools / "kubectl")
    try:
        node.up()
        print(f"export KUBECONFIG={node.kubeconfig}   # helm and kubectl: {tools}", flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        node.down()
    return 0


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    sys.exit(main())
