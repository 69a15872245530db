"""Podman and small local images for the container tests (no registry is reachable).

:func:`ensure_podman` installs Debian's ``podman``, ``runc`` and ``busybox-static``
when they are missing (as ``tests/slurm`` does for Slurm). :func:`build_images` makes
two images with ``podman import`` of root file systems assembled here:

- ``TOOLS``: BusyBox plus this machine's ``python3`` (its interpreter, shared libraries
  and standard library), with ``/etc/os-release`` saying ``ID=allotment-tools``;
- ``PLAIN``: BusyBox alone, ``ID=allotment-plain``.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

TOOLS = "localhost/allotment-test/tools:1"
PLAIN = "localhost/allotment-test/plain:1"
PACKAGES = ("podman", "runc", "busybox-static")
PODMAN = ["podman", "--runtime", "runc"]
BUSYBOX_APPLETS = (
    "sh", "cat", "ls", "echo", "id", "sleep", "head", "dd", "stat", "readlink", "true",
    "false", "env", "nproc", "touch", "mkdir", "rm", "wc", "grep", "test", "ln", "seq",
)  # fmt: skip
SYSTEM_PYTHON = Path("/usr/bin/python3")


def missing() -> list[str]:
    """Why containers cannot be tested here (empty when they can)."""
    reasons = []
    if os.geteuid() != 0:
        reasons.append("root (containers under tenants' uids, device nodes)")
    if not shutil.which("podman") and not shutil.which("apt-get"):
        reasons.append("podman (or apt-get to install it)")
    return reasons


def ensure_podman() -> None:
    """Install Podman, runc and BusyBox from Debian's packages when any is missing."""
    needed = [
        p
        for p, probe in zip(PACKAGES, ("podman", "runc", "busybox"), strict=True)
        if shutil.which(probe) is None
    ]
    if not needed:
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, capture_output=True, env=env)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", *needed], check=True, capture_output=True, env=env
    )


def image_exists(name: str) -> bool:
    return subprocess.run([*PODMAN, "image", "exists", name], check=False).returncode == 0


def _python_files() -> list[tuple[Path, str]]:
    """The system Python 3 (interpreter, libraries, standard library) as (host path,
    path in the image) pairs."""
    python = SYSTEM_PYTHON.resolve()
    out = [(python, "usr/bin/python3")]
    ldd = subprocess.run(["ldd", str(python)], check=True, capture_output=True, text=True)
    for line in ldd.stdout.splitlines():
        parts = line.split()
        path = next((p for p in parts if p.startswith("/")), None)
        if path:
            out.append((Path(path).resolve(), path.lstrip("/")))
    probe = subprocess.run(
        [str(python), "-c", "import sys; print(sys.version_info[:2])"],
        check=True,
        capture_output=True,
        text=True,
    )
    major, minor = (int(x) for x in probe.stdout.strip("()\n").split(","))
    version = f"python{major}.{minor}"
    stdlib = Path("/usr/lib") / version
    for path in stdlib.rglob("*"):
        relative = path.relative_to(stdlib)
        if relative.parts and relative.parts[0] in ("test", "site-packages", "dist-packages"):
            continue
        if "__pycache__" in relative.parts or not path.is_file():
            continue
        out.append((path, f"usr/lib/{version}/{relative}"))
    return out


def _build(name: str, marker: str, *, python: bool) -> None:
    busybox = shutil.which("busybox")
    assert busybox is not None
    with tempfile.TemporaryDirectory(prefix="allotment-image-") as tmp:
        tar_path = Path(tmp) / "rootfs.tar"
        with tarfile.open(tar_path, "w") as tar:

            def directory(path: str, mode: int = 0o755) -> None:
                info = tarfile.TarInfo(path)
                info.type = tarfile.DIRTYPE
                info.mode = mode
                tar.addfile(info)

            def text(path: str, content: str) -> None:
                data = content.encode()
                info = tarfile.TarInfo(path)
                info.size = len(data)
                info.mode = 0o644
                tar.addfile(info, io.BytesIO(data))

            seen: set[str] = set()
            for d in ("bin", "etc", "usr", "usr/bin", "usr/lib", "tmp", "data", "scratch"):
                directory(d, 0o1777 if d == "tmp" else 0o755)
                seen.add(d)
            tar.add(busybox, "bin/busybox")
            for applet in BUSYBOX_APPLETS:
                info = tarfile.TarInfo(f"bin/{applet}")
                info.type = tarfile.SYMTYPE
                info.linkname = "busybox"
                tar.addfile(info)
            text("etc/os-release", f'ID={marker}\nNAME="Allotment test image"\n')
            text("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n")
            text("etc/group", "root:x:0:\n")
            if python:
                for host, inside in _python_files():
                    if inside in seen:
                        continue
                    seen.add(inside)
                    parent = str(Path(inside).parent)
                    if parent not in seen and parent != ".":
                        for i in range(1, len(Path(inside).parts)):
                            part = str(Path(*Path(inside).parts[:i]))
                            if part not in seen:
                                seen.add(part)
                                directory(part)
                    tar.add(str(host), inside, recursive=False)
        subprocess.run(
            [*PODMAN, "import", str(tar_path), name],
            check=True,
            capture_output=True,
        )


def build_images() -> None:
    """Build :data:`TOOLS` and :data:`PLAIN` unless they exist."""
    if not image_exists(TOOLS):
        _build(TOOLS, "allotment-tools", python=True)
    if not image_exists(PLAIN):
        _build(PLAIN, "allotment-plain", python=False)
