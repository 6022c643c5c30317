"""Name lists written back as the host ranges of inventories (docs/inventory.md): the inverse of the range
expansion in testbed.config.expand.

    compress(["h001", "h002", ..., "h256", "rail0", ..., "rail7"]) == ["h[001:256]", "rail[0:7]"]

Expanding every string of the result as an inventory does (a range for its names, anything else for itself)
gives back exactly the names given. A range is `prefix[start:end]suffix` over the name's last number, and
padding follows expand.parse_range: `[001:256]` is zero-padded to the width of the start, `[8:11]` is not. So
`h1` and `h01` never share a range (they expand differently), while `h099` and `h100` do (`h[098:101]`).

Names with brackets (not a valid inventory name) and numbers of more than 9 digits (refused in a range) are
left as they are.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

MIN_RUN = 3  # consecutive names that become a range; fewer are listed as they are
MAX_DIGITS = 9  # expand.parse_range refuses longer numbers

_NUMBERED = re.compile(r"(?P<prefix>.*?)(?P<digits>[0-9]+)(?P<suffix>[^0-9]*)")  # the last run of digits


@dataclass(frozen=True)
class _Numbered:
    prefix: str
    number: int
    padded: int  # the width of a zero-padded number ("007": 3), 0 for an unpadded one ("7", "0", "100")
    suffix: str

    def fits(self, width: int) -> bool:
        """Whether a range padded to `width` (0: unpadded) spells this name's number as the name does."""
        if self.padded:
            return width == self.padded
        return width == 0 or len(str(self.number)) >= width


def _numbered(name: str) -> _Numbered | None:
    if "[" in name or "]" in name:
        return None
    m = _NUMBERED.fullmatch(name)
    if m is None or len(m.group("digits")) > MAX_DIGITS:
        return None
    digits = m.group("digits")
    padded = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
    return _Numbered(m.group("prefix"), int(digits), padded, m.group("suffix"))


def compress(names: Iterable[str], *, keep_order: bool = False, min_run: int = MIN_RUN) -> list[str]:
    """`names` as range strings and plain names: every run of `min_run` or more consecutive names (same prefix
    and suffix, numbers one apart, spelt alike) becomes one range.

    keep_order=False treats `names` as a set: duplicates are dropped and the result is in a sorted order.
    keep_order=True keeps the list as given, duplicates included; only runs of adjacent names that count up
    become ranges, so expanding the result gives back the very list.
    """
    return [text for text, _ in compress_counted(names, keep_order=keep_order, min_run=min_run)]


def compress_counted(
    names: Iterable[str], *, keep_order: bool = False, min_run: int = MIN_RUN
) -> list[tuple[str, int]]:
    """compress(), each string with the number of names it stands for."""
    names = list(names)
    if keep_order:
        return [(text, n) for text, n, _ in _runs(names, min_run)]
    unique = list(dict.fromkeys(names))
    ordered = sorted(unique, key=_set_order(unique))
    return [(text, n) for text, n, _ in sorted(_runs(ordered, min_run), key=lambda item: item[2])]


def _runs(names: list[str], min_run: int) -> list[tuple[str, int, tuple]]:
    """(range or name, how many names it stands for, a sort key) for every run of adjacent names that count
    up, in the order of `names`.
    """
    out: list[tuple[str, int, tuple]] = []
    run: list[tuple[str, _Numbered]] = []

    def flush() -> None:
        if len(run) >= max(min_run, 1):
            first, last, width = run[0][1], run[-1][1], run[0][1].padded
            text = f"{first.prefix}[{first.number:0{width}d}:{last.number:0{width}d}]{first.suffix}"
            out.append((text, len(run), (first.prefix, first.suffix, first.number, width)))
        else:
            out.extend((name, 1, (info.prefix, info.suffix, info.number, info.padded)) for name, info in run)
        run.clear()

    for name in names:
        info = _numbered(name)
        if info is not None and run:
            last, width = run[-1][1], run[0][1].padded
            if (
                (info.prefix, info.suffix) == (last.prefix, last.suffix)
                and info.number == last.number + 1
                and info.fits(width)
            ):
                run.append((name, info))
                continue
        flush()
        if info is None:
            out.append((name, 1, (name, "", -1, -1)))
        else:
            run.append((name, info))
    flush()
    return out


def _set_order(names: list[str]):
    """A sort key for a set of names that puts every run a range can hold next to each other: by prefix and
    suffix, then by how a range would pad the number, then by number. Unpadded numbers that continue a padded
    run take its padding (h098, h099, h100, h101 -> h[098:101]); other unpadded ones stay unpadded.
    """
    numbered = {name: info for name in names if (info := _numbered(name)) is not None}
    padded: set[tuple[str, str, int, int]] = set()  # (prefix, suffix, width, number)
    unpadded: dict[tuple[str, str], list[int]] = {}
    for info in numbered.values():
        if info.padded:
            padded.add((info.prefix, info.suffix, info.padded, info.number))
        else:
            unpadded.setdefault((info.prefix, info.suffix), []).append(info.number)
    width_of: dict[tuple[str, str, int], int] = {}  # an unpadded number -> the padding of its range
    for (prefix, suffix), numbers in unpadded.items():
        numbers.sort()
        width = 0
        for j, n in enumerate(numbers):
            if j == 0 or numbers[j - 1] != n - 1:  # the start of a run of unpadded numbers
                # 100 continues 098, 099 (padded to 3) when the run starts there: 10 ** (3 - 1) == 100
                digits = len(str(n))
                width = digits if n == 10 ** (digits - 1) and (prefix, suffix, digits, n - 1) in padded else 0
            width_of[prefix, suffix, n] = width

    def key(name: str) -> tuple[str, str, int, int]:
        info = numbered.get(name)
        if info is None:
            return (name, "", -1, -1)
        width = info.padded or width_of[info.prefix, info.suffix, info.number]
        return (info.prefix, info.suffix, width, info.number)

    return key


__all__ = ["MIN_RUN", "compress", "compress_counted"]
