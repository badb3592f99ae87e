"""Argument checks shared by the core modules: exact ints, inclusive ranges, clear messages."""

from __future__ import annotations

import math

from .errors import InvalidArgumentError, InvalidArgumentTypeError


def require_int(
    name: str,
    value: object,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    error: type[InvalidArgumentError] = InvalidArgumentError,
    limit_note: str = "",
) -> int:
    """Return ``value`` if it is an int (never a bool or float) within ``[minimum, maximum]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentTypeError(
            f"{name} must be an int, got {type(value).__name__} {value!r}"
        )
    number = int(value)
    suffix = f" ({limit_note})" if limit_note else ""
    if minimum is not None and number < minimum:
        raise error(f"{name}={number} is below the minimum {minimum}{suffix}")
    if maximum is not None and number > maximum:
        raise error(f"{name}={number} exceeds the maximum {maximum}{suffix}")
    return number


def require_seconds(name: str, value: object, *, positive: bool = False) -> float:
    """Return ``value`` as float seconds if it is a finite number, at least 0 (above 0 if
    ``positive``); never a bool."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidArgumentTypeError(f"{name} must be a number of seconds, got {value!r}")
    if value < 0:
        raise InvalidArgumentError(f"{name} must be at least 0 seconds, got {value}")
    if positive and value <= 0:
        raise InvalidArgumentError(f"{name} must be more than 0 seconds, got {value}")
    return float(value)
