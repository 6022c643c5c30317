"""testbed-train's collective mode without a run (hostside/collective.py): TESTBED_COLLECTIVE is read
strictly (anything malformed is a ValueError that names the problem, never another exception), and the ring and
recursive doubling leave every rank with the exact sum, here over loopback TCP between threads.
"""

from __future__ import annotations

import json
import socket
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hostside import collective
from hostside.collective import CollectiveSpec, parse_spec

VALID = {
    "algorithm": "rd",
    "sizes": [4096, 65536],
    "repetitions": 2,
    "warmup": 1,
    "stages": [
        {"config": "rd0", "to": [[1, "127.0.0.1:40001"]], "from": [1]},
        {"config": "rd1", "to": [[2, "127.0.0.1:40002"]], "from": [2]},
    ],
}
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def test_a_valid_spec_is_read_as_given():
    spec = parse_spec(json.dumps(VALID))
    assert spec.algorithm == "rd" and spec.sizes == (4096, 65536) and (spec.repetitions, spec.warmup) == (2, 1)
    assert [(s.config, s.to, s.sources) for s in spec.stages] == [
        ("rd0", ((1, ("127.0.0.1", 40001)),), (1,)),
        ("rd1", ((2, ("127.0.0.1", 40002)),), (2,)),
    ]


@given(st.text(max_size=200))
def test_any_text_is_a_spec_or_a_value_error(text):
    try:
        assert isinstance(parse_spec(text), CollectiveSpec)
    except ValueError as exc:
        assert str(exc).startswith("TESTBED_COLLECTIVE")


@given(JSON)
def test_any_json_value_is_a_spec_or_a_value_error(value):
    try:
        parse_spec(json.dumps(value))
    except ValueError as exc:
        assert str(exc).startswith("TESTBED_COLLECTIVE")


@settings(max_examples=300)
@given(st.sampled_from(["algorithm", "sizes", "repetitions", "warmup", "stages", "config", "to", "from"]), JSON)
def test_a_field_replaced_by_anything_is_a_value_error_naming_it(key, value):
    raw = json.loads(json.dumps(VALID))
    if key in ("config", "to", "from"):
        raw["stages"][1][key] = value
    else:
        raw[key] = value
    try:
        parse_spec(json.dumps(raw))
    except ValueError as exc:
        assert key in str(exc), (key, value, str(exc))


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[[[[" * 20_000, "not JSON"),  # deeper than the parser's recursion limit
        ('{"algorithm": "ring"}', "missing repetitions, sizes, stages, warmup"),
        (json.dumps({**VALID, "extra": 1}), "unknown key(s) extra"),
        (json.dumps({**VALID, "sizes": [1e400]}), "sizes[0]"),  # Infinity is no size
        (json.dumps({**VALID, "repetitions": True}), "repetitions = True"),
        (json.dumps({**VALID, "algorithm": "ring"}), "algorithm ring runs over one configuration, not 2 stages"),
        (json.dumps({**VALID, "stages": [{"config": "x", "to": [[1, "h:0"]], "from": [1]}]}), "no port"),
    ],
)
def test_each_problem_is_named(text, said):
    with pytest.raises(ValueError, match="TESTBED_COLLECTIVE") as exc:
        parse_spec(text)
    assert said in str(exc.value)


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def run_ranks(algorithm: str, world: int, sizes: list[int]) -> dict[int, list[str]]:
    """Every rank in a thread of its own, straight over loopback (no fabric to ask); each rank's printed lines."""
    ports = free_ports(world)

    def stage(rank: int, partner: int, source: int, config: str) -> dict:
        return {"config": config, "to": [[partner, f"127.0.0.1:{ports[partner]}"]], "from": [source]}

    def spec(rank: int) -> CollectiveSpec:
        if algorithm == "ring":
            stages = [stage(rank, (rank + 1) % world, (rank - 1) % world, "ring")]
        else:
            stages = [stage(rank, rank ^ (1 << k), rank ^ (1 << k), f"rd{k}") for k in range(world.bit_length() - 1)]
        raw = {"algorithm": algorithm, "sizes": sizes, "repetitions": 2, "warmup": 1, "stages": stages}
        return parse_spec(json.dumps(raw))

    said: dict[int, list[str]] = {r: [] for r in range(world)}
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            collective.run(spec(rank), rank, world, ("127.0.0.1", ports[rank]), 20.0, None, said[rank].append)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return said


@pytest.mark.parametrize(("algorithm", "world"), [("ring", 4), ("ring", 3), ("rd", 4), ("rd", 2)])
def test_every_rank_ends_with_the_exact_sum(algorithm, world):
    said = run_ranks(algorithm, world, [8, 4096, 40_000])  # 40 000 B: chunks of unequal length on 3 ranks
    done = {lines[-1].split(" checksum ")[1] for lines in said.values()}
    assert len(done) == 1, said  # each rank checked its own result; all hold the same sums
    for lines in said.values():
        reps = [ln for ln in lines if ln.startswith(("allreduce ", "warmup "))]
        assert [ln.split()[0] for ln in reps] == ["warmup", "allreduce", "allreduce"] * 3
        assert all(ln.split()[1:3] in ([algorithm, "8"], [algorithm, "4096"], [algorithm, "40000"]) for ln in reps)


def test_a_wrong_sum_is_an_error_naming_the_element(monkeypatch):
    monkeypatch.setattr(collective, "expected", lambda world, n, seq: collective.contribution(0, n, seq) * 0)
    with pytest.raises(AssertionError) as exc:
        run_ranks("rd", 2, [64])
    assert "ended with" in str(exc.value) and "at element 0" in str(exc.value)
