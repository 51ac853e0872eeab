"""The shape of a call, [batch, length, width], in one form from the command line to the files.

``Shape.parse("4x2048x2048")`` reads the form that file names, calibration keys and
``make reproduce SHAPES=...`` use; ``shape.key`` writes it; ``Shape.of`` takes any of the forms a
shape arrives in (a Shape, a tuple, a result row's ``{"batch", "length", "width"}`` or its key).
"""
from __future__ import annotations

import re
from typing import NamedTuple

# ASCII digits only, no sign, no leading zero: int() would also take "1_6", " 16" and other
# scripts' digits.
KEY = re.compile(r"([1-9][0-9]*)x([1-9][0-9]*)x([1-9][0-9]*)")


class Shape(NamedTuple):
    batch: int
    length: int
    width: int

    @property
    def key(self) -> str:
        """'BATCHxLENGTHxWIDTH', as file names and calibration entries spell it."""
        return f"{self.batch}x{self.length}x{self.width}"

    @property
    def label(self) -> str:
        return f"({self.batch}, {self.length}, {self.width})"

    @property
    def elements(self) -> int:
        return self.batch * self.length * self.width

    def as_dict(self) -> dict:
        return {"batch": self.batch, "length": self.length, "width": self.width}

    @classmethod
    def parse(cls, text: str) -> Shape:
        match = KEY.fullmatch(text.lower()) if isinstance(text, str) else None
        if match is None:
            raise ValueError(f"bad shape {text!r}: write BATCHxLENGTHxWIDTH in positive integers "
                             "(ASCII digits, no leading zeros), e.g. 4x2048x2048")
        return cls(*(int(v) for v in match.groups()))

    @classmethod
    def of(cls, value) -> Shape:
        if isinstance(value, Shape):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        if isinstance(value, dict):
            value = value.get("shape", value)
            return cls(int(value["batch"]), int(value["length"]), int(value["width"]))
        return cls(*(int(v) for v in value))
