"""`python -m tests.fuzz.dry_cli ARGS`: hppctl with the fuzz gates installed (gates.py), so a
subprocess sample can check real tracebacks and hangs without starting workers or labs."""

from tests.fuzz import gates


def main() -> None:
    gates.install_on_import()
    from hppctl.cli import main as hppctl_main

    hppctl_main()


if __name__ == "__main__":
    main()
