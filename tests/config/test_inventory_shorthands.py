"""Host ranges, groups and fibre patterns: expanded at load into the plain inventory, with every problem still at
its file:line. The Opus inventory (2048 GPUs) in 45 lines is exactly the lab bench/opus_scale.py builds in code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed.cli.main import main
from testbed.config.expand import MAX_EXPANDED, parse_range
from testbed.contracts.errors import ConfigError
from testbed.documents import load_inventory, load_playbook
from testbed.documents.inventory import Inventory
from testbed.plan import make_plan

OPUS = "playbooks/inventory/opus-2048.yaml"


@pytest.fixture(scope="module")
def opus_scale(repo):
    sys.path.insert(0, str(repo / "bench"))
    try:
        import opus_scale
    finally:
        sys.path.remove(str(repo / "bench"))
    return opus_scale


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    return path


# --- the Opus inventory -------------------------------------------------------------------------------------------


def test_opus_yaml_is_exactly_the_lab_the_bench_builds_in_code(repo, opus_scale):
    loaded = load_inventory(repo / OPUS).model
    built = Inventory.model_validate(opus_scale.inventory_data(256))
    assert loaded.devices == built.devices
    assert list(loaded.devices) == list(built.devices)
    assert loaded.fibres == built.fibres  # in the same order, too
    assert (loaded.name, loaded.description, loaded.emulated_only) == (built.name, built.description, True)
    assert loaded.spares == [f"h{n}" for n in range(249, 257)]
    assert len(loaded.hosts()) * 8 == 2048 and sum(d.gpus for d in loaded.hosts().values()) == 2048
    assert all(s.size == 256 for s in loaded.switches().values())
    assert len((repo / OPUS).read_text().splitlines()) < 80
    assert opus_scale.inventory_file(Path("/nowhere"), 256) == repo / OPUS


def test_opus_loads_validates_and_plans_gpu_health(repo, capsys):
    # How fast, against the same lab written out plainly, is bench/inventory_load.py's figure: a speed, measured
    # as a ratio on a machine of its own, not asserted here where other work shares the CPU.
    inv = load_inventory(repo / OPUS).model
    plan = make_plan(load_playbook(repo / "playbooks/gpu-health.yaml", inv).model, inv)
    assert plan.inventory is inv
    assert main(["validate", "playbooks/gpu-health.yaml", "--inventory", OPUS]) == 0
    assert main(["validate", OPUS]) == 0
    out = capsys.readouterr().out
    assert "ok playbooks/gpu-health.yaml (playbook, against inventory opus-2048)" in out
    assert "264 devices, 2048 fibres; expanded from devices.rail[0:7] (8), devices.h[001:256] (256)" in " ".join(
        out.split()
    )


# --- ranges, groups, patterns ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key, names",
    [
        ("gpu[001:003]", ["gpu001", "gpu002", "gpu003"]),
        ("gpu[1:3]", ["gpu1", "gpu2", "gpu3"]),
        ("rail[0:2]", ["rail0", "rail1", "rail2"]),
        ("n[08:11]-tor", ["n08-tor", "n09-tor", "n10-tor", "n11-tor"]),
        ("g[9:10]", ["g9", "g10"]),
        ("g[5:5]", ["g5"]),
    ],
)
def test_a_range_is_inclusive_and_pads_to_the_width_of_its_start(key, names):
    assert [name for name, _ in parse_range(key).names()] == names


@pytest.mark.parametrize("key", ["gpu[5:1]", "gpu[1:4", "gpu[a:b]", "gpu[1:2][3:4]", "gpu[1:10:2]", "gpu]"])
def test_a_malformed_range_is_refused(key):
    with pytest.raises(ValueError):
        parse_range(key)


def test_plain_names_are_not_ranges():
    assert parse_range("gpu01") is None


GROUPED = """\
name: lab
groups:
  hosts:
    kind: gpu_host
    driver: ssh
    transport: {type: ssh, host: "{name}.lab.example", user: lab, port: 22}
    ports: [p0, p1]
    rack: "rack{i // 2}"
devices:
  gpu[1:3]: {group: hosts, ports: [p0], description: "host {i} of 3, {{literally}}"}
  gpu9:
    group: hosts
    transport: {type: ssh, host: 127.0.0.9, user: admin}
    rack: rack9
    description: "a plain device's own fields are literal: {i}"
"""


def test_a_device_takes_the_fields_it_does_not_set_from_its_group(tmp_path):
    inv = load_inventory(write(tmp_path, GROUPED)).model
    assert list(inv.devices) == ["gpu1", "gpu2", "gpu3", "gpu9"]
    gpu2 = inv.devices["gpu2"]
    assert (gpu2.transport.host, gpu2.transport.user, gpu2.rack, gpu2.ports) == (
        "gpu2.lab.example",
        "lab",
        "rack1",
        ["p0"],
    )
    assert gpu2.description == "host 2 of 3, {literally}"
    gpu9 = inv.devices["gpu9"]
    # A field the device sets replaces the group's whole: no `port: 22` merged into gpu9's transport.
    assert gpu9.transport.model_dump(include={"host", "user", "port"}) == {
        "host": "127.0.0.9",
        "user": "admin",
        "port": type(gpu9.transport).model_fields["port"].default,
    }
    assert (gpu9.rack, gpu9.ports) == ("rack9", ["p0", "p1"])
    assert gpu9.description == "a plain device's own fields are literal: {i}"


PATTERNED = """\
name: lab
devices:
  ocs[1:2]: {kind: ocs, driver: polatis-scpi, transport: {type: serial, port: /dev/ttyUSB0}, size: 4}
  gpu[1:3]: {kind: gpu_host, driver: ssh, transport: {type: ssh, host: "{name}.x", user: lab}, ports: [p1, p2, p3]}
fibres:
  - {host: gpu1, port: p3, switch: ocs2, ingress: 4, egress: 8}
  - for: {n: 1..3, k: 1..2}
    host: "gpu{n}"
    port: "p{k}"
    switch: "ocs{k}"
    ingress: "{n}"
    egress: "{4 + n}"
"""


def test_a_pattern_expands_in_order_the_first_variable_outermost(tmp_path):
    inv = load_inventory(write(tmp_path, PATTERNED)).model
    assert [(f.host, f.port, f.switch, f.ingress, f.egress) for f in inv.fibres] == [
        ("gpu1", "p3", "ocs2", 4, 8),
        ("gpu1", "p1", "ocs1", 1, 5),
        ("gpu1", "p2", "ocs2", 1, 5),
        ("gpu2", "p1", "ocs1", 2, 6),
        ("gpu2", "p2", "ocs2", 2, 6),
        ("gpu3", "p1", "ocs1", 3, 7),
        ("gpu3", "p2", "ocs2", 3, 7),
    ]


def test_a_problem_in_an_expanded_fibre_is_at_its_pattern_with_its_variables(tmp_path):
    text = PATTERNED.replace('"{4 + n}"', '"{3 + n}"').replace("port: p3", "port: p2")
    with pytest.raises(ConfigError) as refused:
        load_inventory(write(tmp_path, text))
    problems = [(p.line, p.key, p.message) for p in refused.value.problems]
    assert problems == [
        (
            12,
            "fibres[1].egress",
            # the 2 more: egress 4 on ocs2 is out of range too, and it is the number of fibres[0]'s ingress there
            "with n=1, k=1: egress port 4 is out of range for ocs1 (egress ports are 5..8) "
            "(and 2 more from the pattern fibres[1])",
        ),
        (9, "fibres[1].port", "with n=1, k=2: gpu1:p2 is already cabled by fibres[0]"),
    ]


def test_a_problem_in_a_group_field_is_at_the_group_once_for_a_range(tmp_path):
    with pytest.raises(ConfigError) as refused:
        load_inventory(write(tmp_path, GROUPED.replace('rack: "rack{i // 2}"', "rack: [not, a, rack]")))
    problems = [(p.line, p.key, p.message) for p in refused.value.problems]
    assert problems == [
        (8, "devices.gpu1.rack", "from group hosts: Input should be a valid string (and 2 more from group hosts)"),
    ]  # gpu9 sets its own rack


def test_a_typo_in_a_range_cannot_make_a_billion_devices(tmp_path):
    text = GROUPED.replace("gpu[1:3]", "gpu[1:999999999]")
    # Refused before expanding: expanding first would not return (or would exhaust memory) and pytest-timeout
    # would fail the test; no wall-clock bound is needed.
    with pytest.raises(ConfigError) as refused:
        load_inventory(write(tmp_path, text))
    assert f"past {MAX_EXPANDED} names" in refused.value.problems[0].message


# --- whatever the file holds, located errors (fuzzed) ---------------------------------------------------------------

keys = st.sampled_from(["gpu[1:3]", "gpu[01:03]", "gpu[3:1]", "gpu2", "gpu[1:2", "ocs[0:1]", "h[1:200000]", "x"])
fields = st.sampled_from(
    ["{name}", "{i}", "r{i // 0}", "{n + k}", "{x}", "{{", "}", "{i:03d}", "{name * 2}", "plain", "1..3", "3..1"]
) | st.text(max_size=10)
values = st.recursive(
    st.none() | st.integers(-3, 300) | fields,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(fields | st.sampled_from(["group", "kind"]), inner, max_size=3)
    ),
    max_leaves=10,
)
device_bodies = st.fixed_dictionaries(
    {},
    optional={
        "group": st.sampled_from(["hosts", "nope"]) | values,
        "kind": st.sampled_from(["gpu_host", "ocs"]),
        "driver": st.sampled_from(["ssh", "polatis-scpi"]),
        "transport": st.just({"type": "ssh", "host": "{name}.x", "user": "lab"}) | values,
        "size": st.integers(1, 8) | fields,
        "rack": fields,
    },
)
documents = st.fixed_dictionaries(
    {"name": st.just("fuzz"), "devices": st.dictionaries(keys, device_bodies | values, max_size=4)},
    optional={
        "groups": st.dictionaries(st.sampled_from(["hosts", "9bad"]), device_bodies | values, max_size=2) | values,
        "fibres": st.lists(
            st.fixed_dictionaries(
                {"host": fields, "port": st.just("p0"), "switch": fields, "ingress": fields, "egress": fields},
                optional={
                    "for": st.dictionaries(st.sampled_from(["n", "k", "9"]), fields | st.integers(), max_size=2)
                    | values
                },
            )
            | values,
            max_size=3,
        ),
        "spares": st.lists(keys | values, max_size=3),
    },
)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(documents)
def test_any_shorthand_loads_or_gives_located_errors(tmp_path, doc):
    text = yaml.safe_dump(doc, sort_keys=False)
    path = write(tmp_path, text)
    try:
        load_inventory(path)
    except ConfigError as exc:
        for problem in exc.problems:
            assert problem.file == str(path)
            assert problem.line is not None and 1 <= problem.line <= text.count("\n") + 1, (problem, text)
            assert problem.message


# --- the JSON Schema covers the shorthands --------------------------------------------------------------------------


def test_the_schema_takes_shorthands_and_still_flags_misspelt_keys(repo):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((repo / "playbooks/schema/inventory.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    shipped = sorted((repo / "playbooks/inventory").glob("*.yaml")) + [
        repo / "tests/config/cases/inv_ok_shorthands.yaml"
    ]
    for path in shipped:
        assert not list(validator.iter_errors(yaml.safe_load(path.read_text()))), path
    opus = yaml.safe_load((repo / OPUS).read_text())
    opus["devices"]["rail[0:7]"]["sise"] = 256
    opus["fibres"][0]["ingres"] = "{n}"
    opus["devices"]["h[001:256"] = {"group": "hosts"}
    opus["spares"].append("h[1:2")
    assert len(list(validator.iter_errors(opus))) == 4
