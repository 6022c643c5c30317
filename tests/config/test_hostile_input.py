"""Whatever a file holds, loading it ends in a model or in located ConfigErrors: never a crash, never a hang."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed.config.yamlfile import MAX_DEPTH, MAX_NODES, parse_yaml, validate
from testbed.contracts.errors import ConfigError
from testbed.documents.inventory import Inventory
from testbed.documents.playbook import Playbook

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.text(max_size=20)
)
keys = st.sampled_from(
    [
        "name",
        "devices",
        "kind",
        "ocs",
        "driver",
        "transport",
        "type",
        "size",
        "fibres",
        "host",
        "port",
        "switch",
        "ingress",
        "egress",
        "steps",
        "action",
        "configurations",
        "links",
        "circuits",
        "trials",
        "sweep",
        "ms",
        "resource",
        "spares",
    ]
) | st.text(max_size=8)
documents = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=5), max_leaves=30
)


def load(text: str, model) -> None:
    try:
        located = parse_yaml(text, "fuzz.yaml")
        if isinstance(located.data, dict):
            validate(model, located)
    except ConfigError as exc:
        for problem in exc.problems:
            assert problem.file == "fuzz.yaml"
            assert problem.line is None or 1 <= problem.line <= text.count("\n") + 2
            assert problem.message


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300))
def test_random_text_never_crashes_the_loader(text):
    load(text, Inventory)
    load(text, Playbook)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_random_structures_give_located_errors(doc):
    text = yaml.safe_dump(doc, sort_keys=False)
    load(text, Inventory)
    load(text, Playbook)


@pytest.mark.timeout(60)  # without the limit the loader would build 9**9 values: a hang, ended here
def test_a_billion_laughs_is_refused_before_it_is_expanded():
    # Aliases expanding exponentially: the loader must stop at its node limit, not build the expansion.
    text = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
    )
    with pytest.raises(ConfigError) as refused:
        parse_yaml(text, "laughs.yaml")
    (problem,) = refused.value.problems
    assert problem.file == "laughs.yaml" and problem.line == 1
    assert f"expands to more than {MAX_NODES} values" in problem.message


@pytest.mark.parametrize("kind", ["flow", "block"])
def test_yaml_nested_too_deep_is_refused_at_its_line(kind, tmp_path, capsys):
    from testbed.cli import main

    deep = 600
    if kind == "flow":
        text = "name: deep\nsteps: " + "[" * deep + "]" * deep + "\n"
        line = 2
    else:
        text = "name: deep\nx:\n" + "".join(f"{'  ' * (i + 1)}k{i}:\n" for i in range(deep)) + f"{'  ' * (deep + 1)}v\n"
        line = 2 + MAX_DEPTH  # the mapping that goes one level too deep starts there
    (tmp_path / "deep.yaml").write_text(text)
    assert main(["validate", str(tmp_path / "deep.yaml")]) == 2
    printed = capsys.readouterr()
    err = printed.out + printed.err
    assert f"deep.yaml:{line}:" in err and f"nested more than {MAX_DEPTH} deep" in err and "Traceback" not in err
