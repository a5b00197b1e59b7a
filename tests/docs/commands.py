"""Command lines as the documentation prints them: the README's "Everyday use" block and `--help`'s
examples, split into argv lists a test can run (`hppctl` becomes this interpreter's `-m hppctl`)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def readme_block(heading: str = "## Everyday use") -> list[str]:
    """The lines of the first ```bash block after `heading` in README.md."""
    text = (REPO / "README.md").read_text()
    after = text[text.index(heading):]
    block = re.search(r"```bash\n(.*?)```", after, re.S)
    return [line for line in block.group(1).splitlines() if line.strip()]


def commands(line: str) -> list[list[str]]:
    """The commands of one shell line (joined by `&&` or `;`), without comments and `sudo`."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    out: list[list[str]] = [[]]
    for token in lexer:
        if token in ("&&", ";"):
            out.append([])
        else:
            out[-1].append(token)
    return [argv[1:] if argv[:1] == ["sudo"] else argv for argv in out if argv]


def hppctl(argv: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `hppctl ARGS` (argv[0] == "hppctl") from `cwd` with this checkout's package (and `env` added)."""
    assert argv[0] == "hppctl", argv
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="120", **(env or {}))
    return subprocess.run([sys.executable, "-m", "hppctl", *argv[1:]], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)
