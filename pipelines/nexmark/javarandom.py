"""``java.util.Random`` in Python, bit for bit (the JDK's documented algorithm).

Beam's NEXMark generator seeds one ``java.util.Random`` per event with the event's id
and draws every field from it, so matching Beam's events means matching this generator
exactly: the 48-bit linear congruential generator of Knuth (TAOCP vol. 2 §3.2.1) with
the multiplier 0x5DEECE66D, and the JDK's derivations of ``nextInt(bound)`` (rejection
sampling), ``nextLong`` and ``nextDouble``. Java's 32- and 64-bit wrap-around and its
truncating ``%`` and ``/`` are spelled out where they matter. ``tests/unit/test_nexmark.py``
checks every method against the JVM on this machine.
"""
from __future__ import annotations

import math

MULTIPLIER = 0x5DEECE66D
ADDEND = 0xB
MASK_48 = (1 << 48) - 1
DOUBLE_UNIT = 1.0 / (1 << 53)


def to_int32(value: int) -> int:
    """Java's ``(int)`` cast: the low 32 bits, signed."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def to_int64(value: int) -> int:
    """Java's ``long`` wrap-around: the low 64 bits, signed."""
    value &= 0xFFFFFFFFFFFFFFFF
    return value - (1 << 64) if value >= 1 << 63 else value


def java_rem(a: int, b: int) -> int:
    """Java's ``a % b``: truncated division, the sign follows ``a``."""
    r = abs(a) % abs(b)
    return -r if a < 0 else r


def java_div(a: int, b: int) -> int:
    """Java's integer ``a / b``: truncated towards zero."""
    q = abs(a) // abs(b)
    return -q if (a < 0) != (b < 0) else q


def java_round(x: float) -> int:
    """Java's ``Math.round(double)``: floor(x + 1/2), computed without the rounding
    error of adding 0.5 to a large double (``x - floor(x)`` is exact)."""
    f = math.floor(x)
    return int(f) + 1 if x - f >= 0.5 else int(f)


class JavaRandom:
    """A ``java.util.Random`` with the JDK's exact sequences."""

    __slots__ = ("seed",)

    def __init__(self, seed: int) -> None:
        self.seed = (seed ^ MULTIPLIER) & MASK_48

    def next_bits(self, bits: int) -> int:
        """``Random.next(bits)``: the top ``bits`` of the new 48-bit state, as an int."""
        self.seed = (self.seed * MULTIPLIER + ADDEND) & MASK_48
        return to_int32(self.seed >> (48 - bits))

    def next_int(self, bound: int | None = None) -> int:
        """``nextInt()`` (any int) or ``nextInt(bound)`` (uniform in [0, bound))."""
        if bound is None:
            return self.next_bits(32)
        if bound <= 0:
            raise ValueError("bound must be positive")
        r = self.next_bits(31)
        m = bound - 1
        if bound & m == 0:  # a power of two: the high bits, no rejection
            return to_int32((bound * r) >> 31)
        u = r
        while True:
            r = u % bound  # u >= 0 here, so Python's % is Java's
            if to_int32(u - r + m) >= 0:  # no int overflow: u is in a full bucket
                return r
            u = self.next_bits(31)

    def next_long(self) -> int:
        return to_int64((self.next_bits(32) << 32) + self.next_bits(32))

    def next_double(self) -> float:
        return ((self.next_bits(26) << 27) + self.next_bits(27)) * DOUBLE_UNIT
