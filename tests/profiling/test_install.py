"""install.py: the wheel is built from a scratch copy of the source tree; on the device, the steps run in
order into a per-device venv with the system site-packages (a fake endpoint records them)."""

import zipfile
from types import SimpleNamespace

import pytest

from hppctl.profiling import install
from hppctl.profiling.remote import DeviceFailure


class Recorder:
    name = "pi0"

    def __init__(self, fail_on: str | None = None, pip_missing: bool = False):
        self.python = "python3"
        self.commands, self.puts = [], []
        self.fail_on, self.pip_missing = fail_on, pip_missing

    def home(self):
        return "/home/pi"

    def put(self, local, remote):
        self.puts.append((local, remote))

    def run(self, command, timeout=None):
        self.commands.append(command)
        failed = (self.fail_on and self.fail_on in command) or (self.pip_missing and command.endswith("pip --version"))
        return SimpleNamespace(exited=1 if failed else 0, stdout="", stderr="boom\n" if failed else "")


@pytest.mark.slow
def test_build_wheel_leaves_the_checkout_clean(tmp_path):
    root = install.source_root()
    before = {p.name for p in root.iterdir()}
    wheel = install.build_wheel(tmp_path / "wheels")
    assert wheel.name.startswith("hppctl-") and wheel.suffix == ".whl"
    names = zipfile.ZipFile(wheel).namelist()
    assert "hppctl/profiling/probe.py" in names and "hppctl/data/zoo_layers.json" in names
    assert {p.name for p in root.iterdir()} == before


def test_install_puts_the_wheel_and_uses_the_venv(tmp_path):
    wheel = tmp_path / "hppctl-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    ep = Recorder()
    python = install.install(ep, wheel)
    base = "/home/pi/.cache/hppctl/devices/pi0"
    assert python == ep.python == f"{base}/venv/bin/python"
    assert ep.puts == [(str(wheel), f"{base}/{wheel.name}")]
    assert ep.commands[0] == f"mkdir -p {base}"
    assert "--system-site-packages --without-pip" in ep.commands[1] and ep.commands[1].startswith(f"test -x {base}/venv")
    assert "--no-deps --no-index --force-reinstall" in ep.commands[-1] and ep.commands[-1].endswith(wheel.name)


def test_install_falls_back_to_a_venv_with_pip(tmp_path):
    wheel = tmp_path / "hppctl-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    ep = Recorder(pip_missing=True)
    install.install(ep, wheel)
    assert any(c.startswith("rm -rf") and "venv --system-site-packages" in c for c in ep.commands)


def test_a_failed_step_is_a_device_failure_naming_it(tmp_path):
    wheel = tmp_path / "hppctl-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    with pytest.raises(DeviceFailure, match="--install: pip install of the wheel failed \\(exit 1\\): boom"):
        install.install(Recorder(fail_on="pip install"), wheel)
