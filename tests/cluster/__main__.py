"""Bring a test cluster up by hand: ``python3 -m tests.cluster prepare|images|up|kind-image`` (root).

See --help for what each action does."""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from tests.cluster import images
from tests.cluster.kind import local_runtime
from tests.cluster.kind_image import NODE_IMAGE, node_image
from tests.cluster.node import RealNode
from tests.cluster.system import coredns_binary, kube_binaries, log
from tests.fixtures.helm import layer_tools_dir
from tests.fixtures.s3 import ACCESS_KEY, SECRET_KEY, run_seaweedfs

BUCKET = "soaks"  # the README's bucket
SECRET = "soak-s3"  # the README's Secret


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m tests.cluster",
        description="The real single-node cluster of the e2e tests (root, Linux). 'prepare' builds or "
        "reuses the Kubernetes binaries, CoreDNS and the images; 'images' only the pause and project "
        "images (what .ci/run builds beside the Go builds); 'up' also "
        f"starts the node with an S3 store (bucket {BUCKET!r}, Secret {SECRET!r} in namespace default), "
        "prints how to reach both and keeps them up until Ctrl-C, then tears everything down. "
        f"'kind-image' builds the kind node image offline ({NODE_IMAGE}, for "
        "tests/kind/kind-config.local.yaml) into the Docker daemon that `docker` reaches, or, when none "
        "answers, into the cached data root of the private dockerd that SOAK_KIND_NODE=local starts.",
    )
    parser.add_argument("action", choices=("prepare", "images", "up", "kind-image"))
    parser.add_argument(
        "--workdir", type=Path, help="Where the node keeps its state and logs (default: a temp dir, removed)."
    )
    args = parser.parse_args(argv)
    if args.action == "kind-image":
        with local_runtime():
            print(node_image())
        return 0
    started = time.monotonic()
    if args.action == "images":
        images.pause_image()
        images.project_image()
        log(f"images ready in {time.monotonic() - started:.0f} s")
        return 0
    kube_binaries(node=True)
    coredns_binary()
    images.pause_image()
    images.project_image()
    tools = layer_tools_dir()
    log(f"binaries and images ready in {time.monotonic() - started:.0f} s")
    if args.action == "prepare":
        return 0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="soak-node-"))
    node = RealNode(workdir=workdir / "node", kubectl_bin=tools / "kubectl")
    try:
        node.up()
        with run_seaweedfs(workdir / "s3", bucket=BUCKET, ip=node.host_address) as s3:
            node.kubectl(
                "create",
                "secret",
                "generic",
                SECRET,
                "-n",
                "default",
                f"--from-literal=AWS_ACCESS_KEY_ID={ACCESS_KEY}",
                f"--from-literal=AWS_SECRET_ACCESS_KEY={SECRET_KEY}",
            )
            print(
                f"node {node.slot.name}: apiserver {node.api_url}, pods on {node.slot.bridge} "
                f"({node.slot.pod_subnet})\n"
                f"export KUBECONFIG={node.kubeconfig} PATH={tools}:$PATH   # helm and kubectl\n"
                f"S3: bucket {BUCKET} at {s3.endpoint}, Secret {SECRET} in default: add "
                f"--set s3.endpointUrl={s3.endpoint} to the README's helm install\n"
                "Ctrl-C tears the node down.",
                flush=True,
            )
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        stopping = time.monotonic()
        node.down()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
            log(f"node down in {time.monotonic() - stopping:.0f} s; {workdir} removed")
        else:
            log(f"node down in {time.monotonic() - stopping:.0f} s; logs kept in {workdir / 'node' / 'logs'}")
    return 0


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    sys.exit(main())
