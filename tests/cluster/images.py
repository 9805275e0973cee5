"""Images for the real node, built here without a registry and without network inside a build.

- the pause image: Kubernetes' own ``build/pause/linux/pause.c`` (from the Go module cache of
  ``k8s.io/kubernetes``) compiled with ``gcc -static`` into a single-layer ``docker save`` tarball;
- two Debian bookworm root filesystems from ``mmdebstrap`` (runtime: python3; build: python3-venv
  and gcc), imported into a private dockerd as the Dockerfile's base images;
- the project image: the project's own ``Dockerfile`` built by that dockerd with ``--network none``
  from a context holding a wheelhouse prepared on the host (``docker/wheels``), then ``docker save``d.

Everything is cached under ``<cache>/images`` keyed on its inputs; a rebuild happens only when
an input changed. The private dockerd lives only for the build and leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.cluster.system import HostFootprint, cache_root, kube_module_dir, log, remove_cgroups, run_logged
from tests.fixtures.processes import start_server

REPO_ROOT = Path(__file__).resolve().parents[2]
PROJECT_IMAGE = "soak-sidecar:e2e"  # helm/soak-sidecar/ci/kind-values.yaml
PAUSE_IMAGE = "soak.local/pause:3.10"
SUITE = "bookworm"
# The interpreter of both base images: the wheelhouse is resolved for it.
BASE_PYTHON = "3.11"
RUNTIME_PACKAGES = ("python3",)
BUILD_PACKAGES = ("python3", "python3-venv", "gcc", "libc6-dev")
DOCKER_CGROUP_PARENT = "soak-e2e-docker"
DOCKER_EXEC_ROOT = Path("/run/soak-e2e-docker")
# dockerd and its managed containerd also write these fixed places.
DOCKER_PATHS = (DOCKER_EXEC_ROOT, Path("/run/docker"), Path("/run/containerd"))


def images_dir() -> Path:
    path = cache_root() / "images"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:16]


def _atomic_output(final: Path) -> Path:
    return final.with_name(f".{final.name}.{os.getpid()}.tmp")


# ---------------------------------------------------------------- single-layer image tarballs


def single_layer_image(
    dest: Path, tag: str, files: dict[str, tuple[bytes, int]], entrypoint: list[str]
) -> None:
    """A ``docker save`` tarball of one layer holding ``files`` (path -> (content, mode))."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (content, mode) in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(content), mode, 0
            tar.addfile(info, io.BytesIO(content))
    layer_bytes = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": entrypoint},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created_by": "tests/cluster/images.py"}],
        },
        sort_keys=True,
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_name = diff_id.removeprefix("sha256:") + "/layer.tar"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": [layer_name]}]).encode()
    tmp = _atomic_output(dest)
    with tarfile.open(tmp, mode="w") as tar:
        for name, content in ((config_name, config), (layer_name, layer_bytes), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(content), 0o644
            tar.addfile(info, io.BytesIO(content))
    tmp.replace(dest)


def pause_image() -> Path:
    """registry-free pause image from Kubernetes' own pause.c (static)."""
    source = kube_module_dir() / "build" / "pause" / "linux" / "pause.c"
    code = source.read_bytes()
    dest = images_dir() / f"pause-{_digest(code, PAUSE_IMAGE.encode())}.tar"
    if dest.is_file():
        return dest
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "pause"
        run_logged(["gcc", "-Os", "-static", "-DVERSION=v3.10-soak", "-o", str(binary), str(source)])
        run_logged(["strip", str(binary)])
        single_layer_image(dest, PAUSE_IMAGE, {"pause": (binary.read_bytes(), 0o755)}, ["/pause"])
    log(f"pause image: {dest} ({dest.stat().st_size // 1024} KiB)")
    return dest


# ---------------------------------------------------------------- base root filesystems


def base_rootfs(packages: Sequence[str]) -> Path:
    """A minbase Debian rootfs tarball with ``packages`` (mmdebstrap; about a minute)."""
    key = _digest(SUITE.encode(), " ".join(sorted(packages)).encode())
    dest = images_dir() / f"rootfs-{SUITE}-{key}.tar"
    if dest.is_file():
        return dest
    if shutil.which("mmdebstrap") is None:
        raise RuntimeError("mmdebstrap is not installed (apt-get install mmdebstrap)")
    tmp = _atomic_output(dest)
    started = time.monotonic()
    run_logged(
        [
            "mmdebstrap",
            "--variant=minbase",
            "--mode=root",
            "--quiet",
            "--format=tar",
            f"--include={','.join(packages)}",
            "--aptopt=APT::Install-Recommends false",
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*",
            SUITE,
            str(tmp),
        ],
        timeout=1200,
    )
    tmp.replace(dest)
    log(f"rootfs {' '.join(packages)}: {dest.stat().st_size >> 20} MiB in {time.monotonic() - started:.0f} s")
    return dest


# ---------------------------------------------------------------- the wheelhouse and the context


def context_files() -> list[str]:
    """What the build may copy: the checkout's files (tracked, or untracked and not ignored) that
    ``.dockerignore`` lets in (it starts from ``*`` and re-includes paths with ``!``)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    admitted = [
        line[1:].strip().rstrip("/")
        for line in (REPO_ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.startswith("!")
    ] + ["Dockerfile", ".dockerignore"]
    return sorted(
        name
        for name in listed.split("\0")
        if name
        and any(name == top or name.startswith(top + "/") for top in admitted)
        and not name.endswith((".pyc", ".so"))
        and "__pycache__" not in name.split("/")
        and (REPO_ROOT / name).is_file()
    )


def wheelhouse(dest: Path, source: Path) -> None:
    """Wheels of the project (built from ``source``) and every dependency in requirements.lock, hash-checked,
    for the base's interpreter."""
    dest.mkdir(parents=True, exist_ok=True)
    lock = REPO_ROOT / "requirements.lock"
    cached = images_dir() / f"wheels-py{BASE_PYTHON}-{_digest(lock.read_bytes())}"
    if not cached.is_dir():
        tmp = _atomic_output(cached)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        run_logged(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--only-binary=:all:",
                "--python-version",
                BASE_PYTHON,
                "--implementation",
                "cp",
                "--platform",
                "manylinux_2_28_x86_64",
                "--platform",
                "manylinux_2_17_x86_64",
                "--platform",
                "manylinux2014_x86_64",
                "--platform",
                "linux_x86_64",
                "--require-hashes",
                "--dest",
                str(tmp),
                "-r",
                str(lock),
            ],
            timeout=900,
        )
        tmp.replace(cached)
    for wheel in cached.glob("*.whl"):
        shutil.copy2(wheel, dest / wheel.name)
    # The project itself, from the files the build would see.
    run_logged(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(dest), str(source)],
        timeout=600,
    )


def build_context(dest: Path) -> str:
    """Lay out the build context; returns a digest of everything in it."""
    h = hashlib.sha256()
    for name in context_files():
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, target)
        h.update(name.encode() + b"\0" + (REPO_ROOT / name).read_bytes())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------- a private dockerd


@contextlib.contextmanager
def private_dockerd(
    workdir: Path,
    *,
    exec_root: Path = DOCKER_EXEC_ROOT,
    cgroup_parent: str = DOCKER_CGROUP_PARENT,
    extra_args: Sequence[str] = (),
) -> Iterator[dict[str, str]]:
    """dockerd with its own data root (under ``workdir``), exec root, socket, no bridge and no iptables."""
    data_root = workdir / "docker"
    sock = exec_root / "docker.sock"
    footprint = HostFootprint((exec_root, *DOCKER_PATHS[1:]))
    exec_root.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "dockerd.log"
    argv = [
        "dockerd",
        f"--data-root={data_root}",
        f"--exec-root={exec_root}",
        f"--pidfile={exec_root / 'dockerd.pid'}",
        f"--host=unix://{sock}",
        "--bridge=none",
        "--iptables=false",
        "--ip6tables=false",
        "--ip-masq=false",
        "--exec-opt=native.cgroupdriver=cgroupfs",
        f"--cgroup-parent=/{cgroup_parent}",
        "--storage-driver=overlay2",
        *extra_args,
    ]
    env = {"DOCKER_HOST": f"unix://{sock}", "DOCKER_BUILDKIT": "0"}
    with log_path.open("ab") as out:
        proc = start_server(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while subprocess.run(["docker", "info"], env={**os.environ, **env}, capture_output=True).returncode:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dockerd did not start:\n{log_path.read_text(errors='replace')[-3000:]}")
            time.sleep(0.5)
        yield env
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
        footprint.clean()
        for leftover in (cgroup_parent, "docker"):
            remove_cgroups(leftover)


def docker(env: dict[str, str], *args: str, timeout: float = 1800, stdin: Path | None = None) -> str:
    return run_logged(["docker", *args], env=env, timeout=timeout, stdin=stdin)


@contextlib.contextmanager
def _build_lock() -> Iterator[None]:
    """An flock in the cache: two test runs on one machine never run the private dockerd at once."""
    with (images_dir() / ".build.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _build_project_image(
    tmp: Path, context: Path, dest: Path, runtime: Path, build: Path
) -> tuple[str, float]:
    """Build the image from ``context`` into ``dest`` (and drop the images of other inputs); its size
    (bytes) and when the build started."""
    wheelhouse(context / "docker" / "wheels", context)
    started = time.monotonic()
    with private_dockerd(tmp) as env:
        bases = {"soak-base-runtime:" + runtime.stem: runtime, "soak-base-build:" + build.stem: build}
        for tag, rootfs in bases.items():
            docker(env, "import", str(rootfs), tag, timeout=600)
        runtime_tag, build_tag = bases
        docker(
            env,
            "build",
            "--network",
            "none",
            "--pull=false",
            "--tag",
            PROJECT_IMAGE,
            "--build-arg",
            f"PYTHON_IMAGE={runtime_tag}",
            "--build-arg",
            f"BUILD_IMAGE={build_tag}",
            str(context),
        )
        tmp_dest = _atomic_output(dest)
        docker(env, "save", "--output", str(tmp_dest), PROJECT_IMAGE, timeout=600)
        size = docker(env, "image", "inspect", "--format", "{{.Size}}", PROJECT_IMAGE).strip()
    dest.with_suffix(".size").write_text(size, encoding="utf-8")
    tmp_dest.replace(dest)
    for old in images_dir().glob("soak-sidecar-*.tar"):
        if old != dest:
            old.unlink(missing_ok=True)
            old.with_suffix(".size").unlink(missing_ok=True)
    return size, started


def project_image() -> Path:
    """The project's image as a ``docker save`` tarball, built from its Dockerfile offline."""
    runtime = base_rootfs(RUNTIME_PACKAGES)
    build = base_rootfs(BUILD_PACKAGES)
    with tempfile.TemporaryDirectory(prefix="soak-image-") as tmp:
        context = Path(tmp) / "context"
        key = build_context(context)
        dest = (
            images_dir()
            / f"soak-sidecar-{_digest(key.encode(), runtime.name.encode(), build.name.encode())}.tar"
        )
        if dest.is_file():
            return dest
        with _build_lock():  # one private dockerd at a time: its exec root and socket are fixed
            if dest.is_file():  # built by another run while this one waited
                return dest
            size, started = _build_project_image(Path(tmp), context, dest, runtime, build)
    log(f"project image: {int(size) >> 20} MiB, built in {time.monotonic() - started:.0f} s")
    return dest
