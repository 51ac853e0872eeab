"""What the training study's numeric parameters may be: ``Range`` and ``ParameterError``, shared
by the tasks, the training configuration and the study."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

# --- parameter checks ----------------------------------------------------------------------------

class ParameterError(ValueError):
    """A parameter of the training study of the wrong type or outside its range; the message
    names the parameter, its value and what it may be."""


@dataclass(frozen=True)
class Range:
    """What a numeric parameter may be: an integer or a finite real (a bool is neither), at least
    (or above, ``low_open``) ``low`` and at most (or below, ``high_open``) ``high``, or None
    where ``optional``."""
    integer: bool = False
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    optional: bool = False

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a finite number"
        if self.low is not None and self.high is not None:
            text = (f"{kind} in {'(' if self.low_open else '['}{self.low}, {self.high}"
                    f"{')' if self.high_open else ']'}")
        elif self.low is not None:
            text = f"{kind} {'>' if self.low_open else '>='} {self.low}"
        elif self.high is not None:
            text = f"{kind} {'<' if self.high_open else '<='} {self.high}"
        else:
            text = kind
        return text + (", or None" if self.optional else "")

    def admits(self, value) -> bool:
        if value is None:
            return self.optional
        if isinstance(value, bool) or not isinstance(
                value, numbers.Integral if self.integer else numbers.Real):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def check(self, name: str, value):
        """``value``, or ParameterError naming ``name``, the value and this range."""
        if not self.admits(value):
            raise ParameterError(f"{name} must be {self.describe()}, got {value!r}")
        return value


COUNT = Range(integer=True, low=1)  # sizes, lengths, step counts
OFFSET = Range(integer=True, low=0)  # warm-up steps, seeds
SECONDS = Range(low=0, low_open=True, optional=True)  # a time budget; None: none
LEARNING_RATE = Range(low=0, low_open=True)


def check_int(owner: str, name: str, value, minimum: int = 1) -> None:
    Range(integer=True, low=minimum).check(f"{owner}: {name}", value)


def check_list(name: str, value, item: Range) -> None:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value:
        raise ParameterError(f"{name} must be a non-empty list, each {item.describe()}, got "
                             f"{value!r}")
    for i, v in enumerate(value):
        item.check(f"{name}[{i}]", v)
    if len(set(value)) != len(value):
        raise ParameterError(f"{name} must not repeat a value, got {value!r}")
