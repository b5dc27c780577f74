"""Argument types shared by the verbs.

Usage::

    p.add_argument("--window", type=finite_float, default=0.5)   # 'nan' / 'inf' -> exit 2, naming the option
"""

from __future__ import annotations

import argparse
import math


def finite_float(text: str) -> float:
    """A float that is a number: 'nan' and 'inf' parse as floats but pass every '<= 0' check and switch
    limits off silently (a p99 SLO of nan was 'met')."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"'{text}' is not a finite number")
    return value
