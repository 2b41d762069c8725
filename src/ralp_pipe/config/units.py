"""Units of the configuration: tc rates (``1gbit``) and sizes (``1mb``), parsed in one place.

tc's k/m/g prefixes are powers of 1000; rates are bits per second, sizes bytes.
"""

from __future__ import annotations

import re

from ralp_pipe.errors import ConfigError

UNLIMITED = "unlimited"
# tc shapes wire bytes; TCP over Ethernet carries 1448 payload bytes per 1514-byte frame.
TCP_PAYLOAD_PER_WIRE_BYTE = 1448 / 1514
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$")
_RATE_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)(b|k|kb|m|mb|g|gb)?$")
_SIZE_UNITS = {None: 1.0, "b": 1.0, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9}


def rate_bits_per_s(rate: str, key: str = "network.rate") -> float | None:
    """Bits/s of a tc rate such as ``1gbit`` (``unlimited``: None); a bad rate raises naming `key`."""
    if rate == UNLIMITED:
        return None
    match = _RATE.match(rate)
    if not match:
        raise ConfigError(f"{key}={rate!r} is not a tc rate: use e.g. 100mbit, 1gbit, 10gbit or {UNLIMITED}")
    return float(match.group(1)) * _RATE_UNITS[match.group(2)]


def rate_bytes_per_s(rate: str, key: str = "network.rate") -> float | None:
    """Bytes/s of a tc rate (``unlimited``: None)."""
    bits = rate_bits_per_s(rate, key)
    return None if bits is None else bits / 8


def payload_bytes_per_s(rate: str, key: str = "network.rate") -> float | None:
    """TCP payload bytes/s one direction of a link shaped to `rate` carries (``unlimited``: None)."""
    wire = rate_bytes_per_s(rate, key)
    return None if wire is None else wire * TCP_PAYLOAD_PER_WIRE_BYTE


def in_series(rate: float | None, cap: float | None) -> float | None:
    """What a transport moves per second over a link of `rate` when each byte also costs the transport's own
    time, `cap` being what it moves alone (a CPU-bound transport such as gRPC): 1 / (1/rate + 1/cap), in the
    units both are given in; None (unlimited) on either side drops out, both None is None."""
    if rate is None or cap is None:
        return cap if rate is None else rate
    return 1.0 / (1.0 / rate + 1.0 / cap)


def size_bytes(size: str, key: str = "network.burst") -> float:
    """Bytes of a tc size such as ``1mb`` (tc's burst); a bad size raises naming `key`."""
    match = _SIZE.match(size)
    if not match:
        raise ConfigError(f"{key}={size!r} is not a tc size: use e.g. 64kb or 1mb")
    return float(match.group(1)) * _SIZE_UNITS[match.group(2)]
