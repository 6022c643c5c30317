"""Pieces shared by the inventory and playbook models."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, StringConstraints

NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_.-]*$"
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]


class Strict(BaseModel):
    """Unknown keys are errors: a misspelt key silently ignored is a wrong experiment."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _expand_ports(value):
    """Accept `[1, 2, "5-8"]` or `"1-4, 9"` and return a sorted list of ints."""
    if value is None:
        return value
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list):
        raise ValueError("expected a list of ports such as [1, 2, '5-8'] or a string such as '1-16, 33-48'")
    ports: set[int] = set()
    for item in items:
        if isinstance(item, bool):
            raise ValueError(f"{item!r} is not a port number")
        if isinstance(item, int):
            ports.add(item)
            continue
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", str(item))
        if not match:
            raise ValueError(f"{item!r} is not a port or a range like '5-8'")
        low = int(match.group(1))
        high = int(match.group(2) or low)
        if high < low:
            raise ValueError(f"range {item!r} runs backwards")
        ports.update(range(low, high + 1))
    return sorted(ports)


PortList = Annotated[list[int], BeforeValidator(_expand_ports)]
