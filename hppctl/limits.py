"""Size limits on what hppctl reads, as named constants (documented in docs/formats.md, Limits).

Every file a user hands hppctl is refused beyond these with one `error:` line naming the file,
the field and the value (exit 2), before any work that grows with the size starts: a file that
is too big must fail in milliseconds, not after minutes of parsing or planning. Each limit is far
above anything a real edge deployment writes and far below what would hang the tool.
Pure constants: imported by the models, the store and the planners, it imports nothing.
"""

from __future__ import annotations

MAX_FILE_BYTES = 16 * 2**20
"""Bytes of one JSON input file (and of any other file hppctl reads whole). The largest legitimate
file is a measured profile, about 1 KiB per layer and device (timings at a few batch sizes,
spreads): 16 MiB holds a 500-layer model on 32 devices; JSON parses at over 100 MB/s."""

MAX_YAML_BYTES = 2 * 2**20
"""Bytes of one YAML input file. PyYAML's safe loader is pure Python (about 0.25 MB/s on the shared
2-core test machine: 4 MiB took 17 s, 1 MB of 20,000 devices 5 s), so a YAML file gets an eighth of
the JSON limit, a worst case of about 8 s: hand-written files (clusters, lab and PSL specs) are a
few KiB, a plan a few KiB; write big profiles as .json."""

MAX_DOCUMENT_VALUES_PER_BYTE = 1
"""A document may hold at most one value (list, mapping, scalar) per byte of its text. No plain
JSON or YAML text can exceed it; YAML aliases can (`&a [*a, *a]` nested 30 deep is 10⁹ values in a
few hundred bytes), and would take validation hours."""

MAX_NESTING = 100
"""Depth of nested lists/mappings in an input file. The deepest real field is 4 (a profile's
`devices.N.forward_s.L.B`); Python's parsers raise RecursionError near 1000."""

MAX_VALUE_CHARS = 80
"""An error line echoes at most this many characters of an offending value (then `…`), so that a
50 MB string in a file does not become a 50 MB error line."""

MAX_TEXT_CHARS = 4_096
"""A free-text field of a cluster (host, user, python, known_hosts, identity_file): Linux's PATH_MAX;
nothing longer names a file, a command or a host. A 1 MB `python:` came back whole, twice, in the
profiler's failure lines (2 MB of stderr)."""

MAX_ERROR_LINE_CHARS = 1_000
"""An `error:` line is at most this long, whatever it quotes: paths and flag values are user text that
no field validator shortens (a 100,000-character --profile path was a 100 KB error line). Cut in the
middle, so the start (what) and the end (why) both survive."""

MAX_DEVICES = 20_000
"""Devices of a cluster or profile, hosts of a lab spec. Validation is linear (20,000 devices
validate in about a second); the papers hppctl implements plan on at most a few hundred."""

MAX_LAYERS = 4_096
"""Layers of a profile or plan. The largest built-in model at fine granularity has a few hundred;
the planners' dynamic programs grow with the square of the layer count."""

MAX_MICRO_BATCHES = 16_384
"""Micro-batches per round of a plan (global batch / micro-batch). The simulator and the schedule
reports grow with it; 10,000 (`--global-batch 10000 --micro-batch 1`) stays allowed, 10⁶ hung."""

MAX_PSL_CLIENTS = 5_000
"""PSL clients (after `count` expansion); the paper's largest instances have a few hundred."""

MAX_PSL_HELPERS = 100
"""PSL helpers (after `count` expansion); the paper's instances have at most 10."""

MAX_PSL_PAIRS = 50_000
"""PSL helpers x clients. A plan stores six such matrices (about 20 bytes a number): 50,000 pairs
keep it readable under MAX_FILE_BYTES, and the solvers' work grows with the pairs."""

MAX_PSL_SLOTS = 100_000
"""Slots of the forward horizon T_f on the time-indexed solvers' grid (admm, exact). `auto` uses
100; the paper's instances have 176 to 445 over the whole horizon. `slot: 1e-12` would make 10¹²."""

MIN_PSL_SLOT_S = 1e-6
"""Shortest slot a PSL spec or --slot may give: nothing hppctl times is finer than a microsecond."""

MAX_BATCH_SAMPLES = 2**20
"""Samples of one batch in a PSL spec or plan. Edge devices train batches of tens to hundreds of
samples; a batch is multiplied into float activation and memory sizes, and 10**400 overflowed them."""

MAX_WORKDIR_BYTES = 64 * 2**20
"""Bytes of the files of one `--workdir` (runtime/workdir.py): it is read whole, hashed and shipped
to every SSH device of a run. Code is kilobytes to a few megabytes; 64 MiB takes about 5 s at
100 Mbit/s. Datasets belong on the devices (or behind a dataset factory), not in the workdir."""

MAX_WORKDIR_FILES = 10_000
"""Files (and symbolic links) of one `--workdir`: a source tree of a few hundred modules, not a
virtual environment or a dataset folder."""
