"""testbed.config.ranges.compress is the inverse of the inventory's range expansion: what it writes, an
inventory expands back to exactly the names it was given.
"""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.config.expand import expand_inventory
from testbed.config.ranges import compress, compress_counted
from testbed.config.yamlfile import LocatedData


def expand_spares(items: list[str]) -> list[str]:
    """`items` as the inventory expands a `spares:` list (ranges and plain names, in order)."""
    expanded = expand_inventory(LocatedData("t.yaml", {"spares": list(items)}, {}))
    assert expanded.problems == []
    return expanded.data["spares"]


def expand_devices(items: list[str]) -> list[str]:
    """The device names `items` define as keys of `devices:`; the expansion refuses a name defined twice."""
    expanded = expand_inventory(LocatedData("t.yaml", {"devices": {item: {} for item in items}}, {}))
    assert expanded.problems == []
    return list(expanded.data["devices"])


def names(prefix: str, numbers, width: int = 0, suffix: str = "") -> list[str]:
    return [f"{prefix}{n:0{width}d}{suffix}" for n in numbers]


@pytest.mark.parametrize(
    ("given_names", "written"),
    [
        (names("h", range(1, 257), 3), ["h[001:256]"]),
        (names("gpu", range(1, 5), 2), ["gpu[01:04]"]),
        (
            names("rail", range(8)) + names("h", [*range(1, 121), *range(122, 257)], 3),
            ["h[001:120]", "h[122:256]", "rail[0:7]"],
        ),
        (names("n", range(8, 12), suffix="-tor"), ["n[8:11]-tor"]),  # docs/inventory.md
        (["h1", "h01", "h2", "h02", "h3", "h03"], ["h[1:3]", "h[01:03]"]),  # they expand differently
        (["h098", "h099", "h100", "h101"], ["h[098:101]"]),  # 100 needs no padding to be 3 wide
        (["h9", "h10", "h11"], ["h[9:11]"]),
        (["gpu01", "gpu02", "ocs1", "chip"], ["chip", "gpu01", "gpu02", "ocs1"]),  # short runs stay as they are
        (["h1234567890", "h1234567891", "h1234567892"], ["h1234567890", "h1234567891", "h1234567892"]),  # 10 digits
        ([], []),
    ],
)
def test_compress_writes_ranges_as_inventories_do(given_names, written):
    assert compress(given_names) == written
    assert sorted(expand_spares(written)) == sorted(set(given_names))


def test_keep_order_only_joins_adjacent_names_and_keeps_duplicates():
    listed = ["h3", "h1", "h2", "h4", "h5", "h6", "h6", "gpu01"]
    assert compress(listed, keep_order=True) == ["h3", "h1", "h2", "h[4:6]", "h6", "gpu01"]
    assert compress_counted(listed, keep_order=True)[3] == ("h[4:6]", 3)
    assert compress(listed) == ["gpu01", "h[1:6]"]


# Names as an inventory may spell them: a few prefixes and suffixes so that runs happen, numbers padded or
# not (h7, h07, h007 are three names), names without digits, numbers too long for a range, and free text.
_NAME_CHARS = string.ascii_letters + string.digits + "_.-"
numbered = st.builds(
    lambda prefix, n, width, suffix: f"{prefix}{n:0{width}d}{suffix}",
    st.sampled_from(["h", "gpu", "rail", "n", "rack1-h", "a.b_", "x"]),
    st.one_of(st.integers(0, 40), st.integers(90, 130), st.integers(995, 1010), st.integers(0, 10**11)),
    st.sampled_from([0, 0, 0, 2, 3, 4]),
    st.sampled_from(["", "", "", "-tor", ".lab", "x"]),
)
plain = st.sampled_from(["ocs", "chip", "spare", "h", "rail", "h-", "x.y"])
free = st.builds(
    lambda first, rest: first + rest, st.sampled_from(string.ascii_letters), st.text(_NAME_CHARS, max_size=6)
)


@st.composite
def runs(draw) -> list[str]:
    """Consecutive numbers, mostly spelt alike: h7, h8, h09, h10, h11 is a run whose spellings differ."""
    prefix = draw(st.sampled_from(["h", "gpu", "n", "x1y"]))
    suffix = draw(st.sampled_from(["", "", "-tor"]))
    start = draw(st.sampled_from([0, 1, 7, 8, 95, 97, 995, 998, 999_999_998, 10**10]))  # 10 digits: no range
    width = draw(st.sampled_from([0, 2, 3, 4]))
    widths = draw(st.lists(st.sampled_from([width, width, width, 0, 1, 2, 3, 4]), min_size=1, max_size=12))
    return [f"{prefix}{n:0{w}d}{suffix}" for n, w in enumerate(widths, start)]


name_lists = st.lists(
    st.one_of(numbered.map(lambda name: [name]), plain.map(lambda name: [name]), free.map(lambda name: [name]), runs()),
    max_size=12,
).map(lambda parts: [name for part in parts for name in part])


@settings(max_examples=400, deadline=None)
@given(name_lists)
def test_expanding_the_compressed_set_gives_back_exactly_the_names(listed):
    written = compress(listed)
    assert sorted(expand_spares(written)) == sorted(set(listed))
    assert sorted(expand_devices(written)) == sorted(set(listed))  # and no name twice
    assert [n for _, n in compress_counted(listed)] == [len(expand_spares([w])) for w in written]
    assert len(written) <= len(set(listed))


@settings(max_examples=400, deadline=None)
@given(name_lists)
def test_expanding_the_compressed_list_gives_back_the_very_list(listed):
    assert expand_spares(compress(listed, keep_order=True)) == listed


@settings(max_examples=200, deadline=None)
@given(name_lists, st.randoms(use_true_random=False))
def test_the_compressed_set_does_not_depend_on_the_order_given(listed, random):
    shuffled = list(listed)
    random.shuffle(shuffled)
    assert compress(shuffled) == compress(listed)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 1200), unique=True, max_size=80), st.sampled_from([0, 2, 3, 4]))
def test_every_run_of_three_or_more_names_is_one_range(numbers, width):
    """h[...] at any padding: each maximal run of 3+ consecutive numbers is one range, the rest plain names.
    (Padded, a run may continue past the padding: h098, h099, h100 is h[098:100].)
    """
    listed = names("h", numbers, width)
    written = compress(listed)
    assert sorted(expand_spares(written)) == sorted(listed)
    present = set(numbers)
    starts = [n for n in present if n - 1 not in present]
    lengths = [next(k for k in range(n, n + len(present) + 1) if k not in present) - n for n in starts]
    assert sum(1 for w in written if "[" in w) == sum(1 for k in lengths if k >= 3)
    assert sum(1 for w in written if "[" not in w) == sum(k for k in lengths if k < 3)
