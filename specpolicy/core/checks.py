"""Config checks a plugin's ``specpolicy_validate_config`` hook raises through, before any model loads.

Each failure is a ``ConfigError`` (``specpolicy.core.errors``) whose one line names the key, the
value and the accepted range: ``policy.tau must be a number in [0, 1], got 1.5``. Re-exported from
``specpolicy`` (``from specpolicy import check_init, integer, number, choice, boolean, check_keys``);
``specpolicy.run.validation`` applies them to the whole config.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable, Mapping
from typing import Any

from specpolicy.core.errors import ConfigError, unknown_key_message


def check_keys(group: str, config: Mapping[str, Any], known: Iterable[str]) -> None:
    """ConfigError for the first key of ``config`` not in ``known`` (with the closest known key)."""
    known = list(known)
    for key in config:
        if key not in known:
            raise ConfigError(unknown_key_message(f"{group}.{key}", known, f"{group}."))


def check_init(group: str, cls: type, config: Mapping[str, Any], *skip: str) -> Any:
    """Check ``config``'s keys against the keyword parameters of ``cls.__init__`` (less ``skip``,
    e.g. ``"runtime"``, passed as None), then build ``cls(**config)`` -- for classes that validate
    their own arguments and are cheap to build (policies, the suffix drafter, loggers). Returns
    the instance."""
    # the class's own __init__ is what the config fills (a subclass's, unsound in general, is the point here)
    params = [
        p
        for p in inspect.signature(cls.__init__).parameters.values()  # type: ignore[misc]
        if p.name != "self" and p.name not in skip and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    check_keys(group, config, [p.name for p in params])
    return cls(**dict.fromkeys(skip), **config)


def integer(key: str, value: Any, minimum: int | None = None, maximum: int | None = None, note: str = "") -> int:
    """``value`` as an int when it is an integer (not a bool) in ``[minimum, maximum]``;
    otherwise ConfigError ``<key> must be an integer >= minimum[ and <= maximum][ (note)], got <value>``."""
    ok = isinstance(value, int) and not isinstance(value, bool)
    ok = ok and (minimum is None or value >= minimum) and (maximum is None or value <= maximum)
    if not ok:
        bounds = " and ".join(
            b
            for b in (f">= {minimum}" if minimum is not None else "", f"<= {maximum}" if maximum is not None else "")
            if b
        )
        raise ConfigError(
            f"{key} must be an integer{' ' + bounds if bounds else ''}{f' ({note})' if note else ''}, got {value!r}"
        )
    return int(value)


def number(
    key: str, value: Any, low: float, high: float = math.inf, low_open: bool = False, high_open: bool = False
) -> float:
    """``value`` as a float when it is a finite number in the interval (``[low, high]``, ends
    open as asked); otherwise ConfigError ``<key> must be a number in [low, high], got <value>``."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open or high == math.inf else ']'}"
        raise ConfigError(f"{key} must be a number in {interval}, got {value!r}")
    return float(value)


def choice(key: str, value: Any, choices: Iterable[Any]) -> Any:
    """``value`` when it is one of ``choices``; otherwise ConfigError listing them."""
    choices = list(choices)
    if value not in choices:
        raise ConfigError(f"{key} must be one of {', '.join(map(str, choices))}, got {value!r}")
    return value


def boolean(key: str, value: Any) -> bool:
    """``value`` when it is true or false; otherwise ConfigError."""
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    return value
