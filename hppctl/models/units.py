"""Units parsed in exactly one place: byte sizes ("3GB") and bandwidths ("100mbit").

Internally everything is bytes (int) and bytes per second (float). Files may use either a
plain number (bytes, bytes/s) or a string with a unit.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator, Field

_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30,
}
# tc(8) conventions: "bit" suffixes are bits per second, "bps" suffixes are BYTES per second.
_RATE_UNITS = {
    "bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8,
    "kibit": 1024 / 8, "mibit": 1024**2 / 8, "gibit": 1024**3 / 8,
    "bps": 1, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9,
}
_NUMBER_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: object) -> int:
    """'3GB' -> 3_000_000_000, '512MiB' -> 536870912, 1024 -> 1024. Rejects negatives and junk."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size like '4GB', got {value!r}")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    elif isinstance(value, str) and (m := _NUMBER_UNIT.match(value)):
        number, unit = float(m.group(1)), m.group(2).lower()
    else:
        raise ValueError(f"expected a size like '4GB' or a number of bytes, got {value!r}")
    if unit not in _SIZE_UNITS:
        raise ValueError(f"unknown size unit {unit!r} in {value!r} (use B, KB, MB, GB, KiB, MiB, GiB)")
    result = int(round(number * _SIZE_UNITS[unit]))
    if result <= 0:
        raise ValueError(f"size must be positive, got {value!r}")
    return result


def parse_rate(value: object) -> float:
    """'100mbit' -> 12.5e6 bytes/s (tc's convention: 'bit' is bits, 'bps' is bytes). A number is bytes/s."""
    if isinstance(value, bool):
        raise ValueError(f"expected a bandwidth like '100mbit', got {value!r}")
    if isinstance(value, (int, float)):
        number, unit = float(value), "bps"
    elif isinstance(value, str) and (m := _NUMBER_UNIT.match(value)):
        number, unit = float(m.group(1)), m.group(2).lower()
    else:
        raise ValueError(f"expected a bandwidth like '100mbit' or a number of bytes/s, got {value!r}")
    if unit not in _RATE_UNITS:
        raise ValueError(f"unknown bandwidth unit {unit!r} in {value!r} (use kbit, mbit, gbit)")
    result = number * _RATE_UNITS[unit]
    if result <= 0:
        raise ValueError(f"bandwidth must be positive, got {value!r}")
    return result


def parse_duration(value: object) -> float:
    """'2ms' -> 0.002 seconds; a number is seconds."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like '2ms', got {value!r}")
    if isinstance(value, (int, float)):
        number, unit = float(value), "s"
    elif isinstance(value, str) and (m := _NUMBER_UNIT.match(value)):
        number, unit = float(m.group(1)), m.group(2).lower() or "s"
    else:
        raise ValueError(f"expected a duration like '2ms', got {value!r}")
    scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6}.get(unit)
    if scale is None:
        raise ValueError(f"unknown duration unit {unit!r} in {value!r} (use s, ms, us)")
    if number < 0:
        raise ValueError(f"duration must not be negative, got {value!r}")
    return number * scale


def format_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def format_rate(bytes_per_s: float) -> str:
    bits = bytes_per_s * 8
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= scale:
            return f"{bits / scale:g} {unit}"
    return f"{bits:g} bit/s"


Bytes = Annotated[int, BeforeValidator(parse_bytes), Field(gt=0)]
"""A positive byte count; files may say '3GB'."""
BytesPerSecond = Annotated[float, BeforeValidator(parse_rate), Field(gt=0)]
"""A positive rate in bytes/s; files may say '100mbit'."""
Seconds = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]
"""A non-negative duration in seconds; files may say '2ms'."""
