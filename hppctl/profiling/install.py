"""`hppctl profile --install`: this project's wheel, built here, installed into a venv on each device.

    build_wheel(dest)               copy the source tree to a temp dir and `pip wheel --no-deps` it
    install(endpoint, wheel)        put the wheel, create ~/.cache/hppctl/devices/<name>/venv with
                                    --system-site-packages (torch, transformers, fabric come from the
                                    device's own Python: nothing is downloaded), pip install the wheel
                                    --no-deps --no-index into it, and point the endpoint's python there

The venv lives under a per-device directory because devices may share a home directory (the
edge lab's hosts share this machine's filesystem, and three concurrent installs into one venv
would race). The venv's own site-packages come before the system's, so the installed wheel wins
over any other hppctl the device's Python has.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from hppctl.errors import RuntimeFailure
from hppctl.profiling.remote import DeviceFailure, SshEndpoint

SOURCE_FILES = ("pyproject.toml", "README.md", "LICENSE")


def source_root() -> Path:
    """The directory holding pyproject.toml and the hppctl package this process runs."""
    import hppctl

    root = Path(hppctl.__file__).resolve().parent.parent
    if not (root / "pyproject.toml").exists():
        raise RuntimeFailure(f"--install builds hppctl's wheel from its source tree, but {root} has no "
                             f"pyproject.toml (this hppctl was installed from a wheel); install it on the "
                             f"devices yourself, or run from a checkout")
    return root


def build_wheel(dest: Path) -> Path:
    """Build the wheel in a scratch copy (so the checkout gets no build/ or egg-info) into `dest`."""
    root = source_root()
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hppctl-wheel-") as scratch:
        tree = Path(scratch) / "src"
        shutil.copytree(root / "hppctl", tree / "hppctl", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for name in SOURCE_FILES:
            if (root / name).exists():
                shutil.copy2(root / name, tree / name)
        result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                                 "--no-index", "--quiet", "--wheel-dir", str(dest), str(tree)],
                                capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeFailure(f"building the hppctl wheel failed: {tail}")
    wheels = sorted(dest.glob("hppctl-*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise RuntimeFailure(f"building the hppctl wheel left no hppctl-*.whl in {dest}")
    return wheels[-1]


def install(endpoint: SshEndpoint, wheel: Path, timeout_s: float = 600) -> str:
    """Install `wheel` into the device's hppctl venv; returns (and sets) the venv's python."""
    base = f"{endpoint.home()}/.cache/hppctl/devices/{endpoint.name}"
    venv, remote_wheel = f"{base}/venv", f"{base}/{wheel.name}"
    _run(endpoint, f"mkdir -p {shlex.quote(base)}", timeout_s, "creating the install directory")
    endpoint.put(str(wheel), remote_wheel)
    python = shlex.quote(endpoint.python)
    vpython = shlex.quote(f"{venv}/bin/python")
    # Without pip of its own, the venv runs the system's pip (visible through the system site-packages),
    # which installs into the venv since sys.prefix is the venv. Fall back to a venv with pip.
    _run(endpoint, f"test -x {vpython} || {python} -m venv --system-site-packages --without-pip {shlex.quote(venv)}",
         timeout_s, "creating the venv")
    if endpoint.run(f"{vpython} -m pip --version", timeout=timeout_s).exited != 0:
        _run(endpoint, f"rm -rf {shlex.quote(venv)} && {python} -m venv --system-site-packages {shlex.quote(venv)}",
             timeout_s, "creating the venv with pip")
    _run(endpoint, f"{vpython} -m pip install --quiet --no-deps --no-index --force-reinstall "
                   f"--disable-pip-version-check {shlex.quote(remote_wheel)}", timeout_s, "pip install of the wheel")
    endpoint.python = f"{venv}/bin/python"
    return endpoint.python


def _run(endpoint: SshEndpoint, command: str, timeout_s: float, what: str) -> None:
    result = endpoint.run(command, timeout=timeout_s)
    if result.exited != 0:
        tail = (result.stderr.strip().splitlines() or result.stdout.strip().splitlines() or ["no output"])[-1]
        raise DeviceFailure(f"--install: {what} failed (exit {result.exited}): {tail}")
