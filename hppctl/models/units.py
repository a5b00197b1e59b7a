"""Units parsed in exactly one place: byte sizes ("3GB") and bandwidths ("100mbit").

Internally everything is bytes (int) and bytes per second (float). Files may use either a
plain number (bytes, bytes/s) or a string with a unit.

Every value must be finite and within the bounds below: `memory: 1e400` reached `int(inf)` (an
OverflowError traceback) and `bandwidth: .inf` was accepted and written back as `null`, a profile
no command could read. The bounds are far beyond any device yet keep every later product finite.
"""

from __future__ import annotations

import math
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
MAX_BYTES = 2**50
"""1 PiB: the largest size a file may give (memory budgets, limits)."""
MIN_RATE, MAX_RATE = 1 / 8, 1e13
"""1 bit/s to 80 Tbit/s, in bytes/s."""
MAX_DURATION = 86400.0
"""One day: the longest duration a file may give (delays, slots)."""
_NUMBER_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: object) -> int:
    """'3GB' -> 3_000_000_000, '512MiB' -> 536870912, 1024 -> 1024. Rejects negatives and junk."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size like '4GB', got {_shown(value)}")
    if isinstance(value, (int, float)):
        number, unit = _as_float(value), ""
    elif isinstance(value, str) and (m := _NUMBER_UNIT.match(value)):
        number, unit = float(m.group(1)), m.group(2).lower()
    else:
        raise ValueError(f"expected a size like '4GB' or a number of bytes, got {_shown(value)}")
    if unit not in _SIZE_UNITS:
        raise ValueError(f"unknown size unit {unit!r} in {_shown(value)} (use B, KB, MB, GB, KiB, MiB, GiB)")
    scaled = _finite(number * _SIZE_UNITS[unit], "size", value)
    if scaled > MAX_BYTES:
        raise ValueError(f"size must be at most {MAX_BYTES} bytes (1 PiB), got {_shown(value)}")
    result = int(round(scaled))
    if result <= 0:
        raise ValueError(f"size must be positive, got {_shown(value)}")
    return result


def parse_rate(value: object) -> float:
    """'100mbit' -> 12.5e6 bytes/s (tc's convention: 'bit' is bits, 'bps' is bytes). A number is bytes/s."""
    if isinstance(value, bool):
        raise ValueError(f"expected a bandwidth like '100mbit', got {_shown(value)}")
    if isinstance(value, (int, float)):
        number, unit = _as_float(value), "bps"
    elif isinstance(value, str) and (m := _NUMBER_UNIT.match(value)):
        number, unit = float(m.group(1)), m.group(2).lower()
    else:
        raise ValueError(f"expected a bandwidth like '100mbit' or a number of bytes/s, got {_shown(value)}")
    unit = unit or "bps"  # YAML reads `bandwidth: 1e6` as a string: a bare number is bytes/s either way
    if unit not in _RATE_UNITS:
        raise ValueError(f"unknown bandwidth unit {unit!r} in {_shown(value)} (use kbit, mbit, gbit)")
    result = _finite(number * _RATE_UNITS[unit], "bandwidth", value)
    if not MIN_RATE <= result <= MAX_RATE:
        raise ValueError(f"bandwidth must be between 1bit and 80tbit per second (got {_shown(value)})")
    return result


def parse_duration(value: object) -> float:
    """'2ms' -> 0.002 seconds; a number is seconds."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like '2ms', got {_shown(value)}")
    if isinstance(value, (int, float)):
        number, unit = _as_float(value), "s"
    elif isinstance(value, str) and (m := _NUMBER_UNIT.match(value)):
        number, unit = float(m.group(1)), m.group(2).lower() or "s"
    else:
        raise ValueError(f"expected a duration like '2ms', got {_shown(value)}")
    scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6}.get(unit)
    if scale is None:
        raise ValueError(f"unknown duration unit {unit!r} in {_shown(value)} (use s, ms, us)")
    result = _finite(number * scale, "duration", value)
    if result < 0:
        raise ValueError(f"duration must not be negative, got {_shown(value)}")
    if result > MAX_DURATION:
        raise ValueError(f"duration must be at most {MAX_DURATION:g} s (one day), got {_shown(value)}")
    return result


def _shown(value: object) -> str:
    """The value as an error line quotes it: its repr, cut short (a 10**400 in a file is 401 digits)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _as_float(value: int | float) -> float:
    """float(value), with an int too large for a float (10**400) read as infinite, refused later."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _finite(number: float, what: str, value: object) -> float:
    """`number`, or ValueError when the file's value is infinite or NaN (1e400 parses as inf)."""
    if not math.isfinite(number):
        raise ValueError(f"{what} must be a finite number, got {_shown(value)}")
    return number


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


Bytes = Annotated[int, BeforeValidator(parse_bytes), Field(gt=0, le=MAX_BYTES)]
"""A positive byte count up to 1 PiB; files may say '3GB'."""
BytesPerSecond = Annotated[float, BeforeValidator(parse_rate), Field(ge=MIN_RATE, le=MAX_RATE)]
"""A rate in bytes/s from 1 bit/s to 80 Tbit/s; files may say '100mbit'."""
Seconds = Annotated[float, BeforeValidator(parse_duration), Field(ge=0, le=MAX_DURATION)]
"""A finite non-negative duration in seconds, at most a day; files may say '2ms'."""
