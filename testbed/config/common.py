"""Pieces shared by the inventory and playbook models."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, StringConstraints

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


LINK_PATTERN = re.compile(
    r"^\s*([A-Za-z][\w.-]*):([A-Za-z][\w.-]*)\s*(->|<->)\s*([A-Za-z][\w.-]*):([A-Za-z][\w.-]*)\s*$"
)


def _check_link(link: str) -> str:
    if not LINK_PATTERN.match(link):
        raise ValueError(f"link {link!r} is not of the form 'host:port -> host:port' (or '<->')")
    return link


Link = Annotated[str, AfterValidator(_check_link)]


PARAM_REF = re.compile(r"^\$\{[A-Za-z][A-Za-z0-9_]*\}$")


def sweepable(low: float, high: float) -> BeforeValidator:
    """A number in [low, high], or `${name}`: a sweep parameter the planner substitutes per sweep point. Used as
    `Annotated[float | str, sweepable(low, high)]`.
    """

    def check(value: object) -> float | str:
        if isinstance(value, str):
            if not PARAM_REF.match(value):
                raise ValueError(f"expected a number or a sweep parameter like '${{delay_ms}}', got {value!r}")
            return value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"expected a number or a sweep parameter like '${{delay_ms}}', got {value!r}")
        if not low <= value <= high:
            raise ValueError(f"must be between {low:g} and {high:g}, got {value!r}")
        return float(value)

    return BeforeValidator(check)


def param_name(ref: str) -> str:
    return ref[2:-1]


def choice(*allowed: str) -> BeforeValidator:
    """One of `allowed`, or `${name}`: a sweep parameter the planner substitutes. Used as
    `Annotated[str, choice(...)]`.
    """

    def check(value: object) -> str:
        if isinstance(value, str) and (value in allowed or PARAM_REF.match(value)):
            return value
        raise ValueError(f"expected one of {', '.join(allowed)} or a sweep parameter like '${{mode}}', got {value!r}")

    return BeforeValidator(check)
