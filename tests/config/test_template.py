"""The template language of ranges, groups and patterns: what it computes, what it refuses, and that no input makes
it do anything but return a value or raise TemplateError (fuzzed).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.config.template import MAX_VALUE, MAX_WIDTH, TemplateError, compile_template, render

ENV = {"name": "gpu007", "i": 7, "n": 300, "k": 0}


@pytest.mark.parametrize(
    "text, expected",
    [
        ("{name}.lab.example", "gpu007.lab.example"),
        ("rack{(i - 1) // 32 + 1}", "rack1"),
        ("{256 + n}", 556),  # one field alone keeps its integer
        ("{n}", 300),
        ("{name}", "gpu007"),
        ("h{i:03d}", "h007"),
        ("{i:03d}", "007"),  # a width makes text
        ("{-i:04d}", "-007"),
        ("{2 + 3 * 4}", 14),  # * before +
        ("{10 - 4 - 3}", 3),  # left to right
        ("{-7 // 2}", -4),  # floor division, as in Python
        ("{-7 % 3}", 2),
        ("{-(i - 10)}", 3),
        ("{{literal}} {i}", "{literal} 7"),
        ("no fields", "no fields"),
        ("", ""),
    ],
)
def test_templates_compute_integer_arithmetic_on_their_variables(text, expected):
    assert render(text, ENV) == expected


@pytest.mark.parametrize(
    "text, message",
    [
        ("{x}", "unknown placeholder {x} (known here: {i}, {k}, {n}, {name})"),
        ("{i / 2}", "use // for integer division"),
        ("{i ** 2}", "** (power) is not allowed"),
        ("{abs(i)}", "function calls are not allowed"),
        ("{name.upper}", "'.' is not allowed"),
        ("{name + 1}", "'name' is text: arithmetic works on integers only"),
        ("{i // k}", "division by zero"),
        ("{i % k}", "division by zero"),
        ("{name:03d}", "a width applies to integers only"),
        ("{i:>3}", "the only format is a zero-padded width"),
        ("{i:0{MAX}d}".replace("{MAX}", str(MAX_WIDTH + 1)), f"a width is 1..{MAX_WIDTH}"),
        ("{i", "'{' without its '}'"),
        ("i}", "single '}'"),
        ("{}", "empty {}"),
        ("{(i}", "missing ')'"),
        ("{i)}", "unexpected ')'"),
        ("{i +}", "ends too early"),
        ("{1000000000 * 1000000000 * 10}", "huge number"),
        ("{1" + "0" * 30 + "}", "more than 18 digits"),
        ("{i; import os}", "';' is not allowed"),
        ("{__import__('os')}", "not allowed"),
    ],
)
def test_templates_refuse_everything_else_with_a_reason(text, message):
    with pytest.raises(TemplateError) as refused:
        render(text, ENV)
    assert message in str(refused.value)


# --- fuzzing --------------------------------------------------------------------------------------------------------


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=st.sampled_from("{}():/*+-%._ 0123456789inamek\\'\"x"), max_size=40) | st.text(max_size=40))
def test_any_text_gives_a_value_or_a_template_error(text):
    try:
        value = render(text, ENV)
    except TemplateError as exc:
        assert str(exc)
        return
    assert isinstance(value, int | str)
    if isinstance(value, int):
        assert abs(value) <= MAX_VALUE


# An expression tree, printed with the fewest parentheses its precedence needs, beside its value worked out here
# by Python's own integer operators (None: the template must refuse it, as division by zero or too large).
PRECEDENCE = {"+": 1, "-": 1, "*": 2, "//": 2, "%": 2}
OPERATORS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "//": lambda a, b: None if b == 0 else a // b,
    "%": lambda a, b: None if b == 0 else a % b,
}

atoms = st.integers(0, 10**6).map(lambda v: (str(v), v, 4)) | st.sampled_from(["i", "n", "k"]).map(
    lambda name: (name, ENV[name], 4)
)


def _combine(draw_pair):
    (op, (lt, lv, lp), (rt, rv, rp), spaces) = draw_pair
    p = PRECEDENCE[op]
    left = f"({lt})" if lp < p else lt
    right = f"({rt})" if rp <= p else rt  # left-associative: a - (b - c) keeps its parentheses
    value = None if lv is None or rv is None else OPERATORS[op](lv, rv)
    if value is not None and abs(value) > MAX_VALUE:
        value = None
    return (f"{left}{spaces}{op}{spaces}{right}", value, p)


def _negate(node):
    text, value, p = node
    return (f"-({text})" if p < 3 else f"-{text}", None if value is None else -value, 3)


def _extend(inner):
    return st.tuples(st.sampled_from(list(OPERATORS)), inner, inner, st.sampled_from(["", " "])).map(
        _combine
    ) | inner.map(_negate)


expressions = st.recursive(atoms, _extend, max_leaves=12)


@settings(max_examples=500, deadline=None)
@given(expressions)
def test_expressions_agree_with_integer_arithmetic(expression):
    text, value, _ = expression
    if len(text) > 200:  # the template's own limit on one field
        return
    if value is None:
        with pytest.raises(TemplateError):
            render("{" + text + "}", ENV)
    else:
        assert render("{" + text + "}", ENV) == value
        assert render("x{" + text + "}", ENV) == f"x{value}"


@given(st.integers(-(10**12), 10**12), st.integers(1, MAX_WIDTH))
def test_a_width_pads_as_python_does(value, width):
    assert render(f"{{n:0{width}d}}", {"n": value}) == f"{value:0{width}d}"


def test_compiling_is_cached_and_the_variables_are_known_before_rendering():
    template = compile_template("h{n:03d}-{k + 1}")
    assert template is compile_template("h{n:03d}-{k + 1}")
    assert template.variables == {"n", "k"}
    with pytest.raises(TemplateError, match=r"unknown placeholder \{k\}"):
        template.check({"n"})
