"""Templates in ranged devices, group defaults and fibre patterns: `"{name}.lab.example"`, `"rack{(i - 1) // 32 + 1}"`,
`"h{n:03d}"`, `"{256 + n}"`.

Deliberately tiny, and not Python: a field `{...}` holds an integer expression over the variables in scope (integer
literals, + - * // %, unary minus, parentheses) and, optionally, a zero-padded width (`:03d`). `{{` and `}}` are
literal braces. The expression is parsed here into a small tree and evaluated on plain ints, so a file can neither
call anything nor build huge values (expressions, widths and results are bounded).

A template that is exactly one field without a width gives the field's value itself (an int for `"{256 + n}"`), so
number fields can be computed; anything else gives a string.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import lru_cache

MAX_EXPRESSION = 200  # characters in one field: far above any real use; bounds the parser's recursion
MAX_WIDTH = 20  # `{n:020d}` at most
MAX_VALUE = 10**18  # no lab numbers anything beyond this; keeps results printable and small

ALLOWED = "integers, variables, + - * // %, and parentheses"

Value = int | str


class TemplateError(ValueError):
    """A template that cannot be parsed, or not rendered with the variables at hand."""


# --- expressions --------------------------------------------------------------------------------------------------

_TOKEN = re.compile(r"\s*(?:(?P<int>[0-9]+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>//|\*\*|[-+*%()])|(?P<bad>\S))")

# A parsed expression: ("int", 5), ("var", "n"), ("neg", node) or (operator, left, right).
Node = tuple


def _tokens(text: str) -> list[tuple[str, str]]:
    out = []
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup
        if kind is None:  # trailing whitespace
            continue
        value = m.group(kind)
        if value == "**":
            raise TemplateError(f"** (power) is not allowed in {{{text}}}; allowed: {ALLOWED}")
        if kind == "bad":
            hint = " (use // for integer division)" if value == "/" else ""
            raise TemplateError(f"{value!r} is not allowed in {{{text}}}{hint}; allowed: {ALLOWED}")
        out.append((kind, value))
    return out


class _Parser:
    """Recursive descent over: expr := term (('+'|'-') term)*; term := unary (('*'|'//'|'%') unary)*;
    unary := '-' unary | atom; atom := INT | NAME | '(' expr ')'.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.at = 0

    def parse(self) -> Node:
        if not self.tokens:
            raise TemplateError("empty {} in a template (write {{ for a literal brace)")
        node = self.expr()
        if self.at < len(self.tokens):
            raise TemplateError(f"unexpected {self.tokens[self.at][1]!r} in {{{self.text}}}; allowed: {ALLOWED}")
        return node

    def peek(self) -> str | None:
        return self.tokens[self.at][1] if self.at < len(self.tokens) else None

    def expr(self) -> Node:
        node = self.term()
        while self.peek() in ("+", "-"):
            op = self.tokens[self.at][1]
            self.at += 1
            node = (op, node, self.term())
        return node

    def term(self) -> Node:
        node = self.unary()
        while self.peek() in ("*", "//", "%"):
            op = self.tokens[self.at][1]
            self.at += 1
            node = (op, node, self.unary())
        return node

    def unary(self) -> Node:
        if self.peek() == "-":
            self.at += 1
            return ("neg", self.unary())
        return self.atom()

    def atom(self) -> Node:
        if self.at >= len(self.tokens):
            raise TemplateError(f"{{{self.text}}} ends too early; allowed: {ALLOWED}")
        kind, value = self.tokens[self.at]
        self.at += 1
        if kind == "int":
            if len(value) > 18:
                raise TemplateError(f"{value[:20]}... in {{{self.text}}}: a number of more than 18 digits")
            return ("int", int(value))
        if kind == "name":
            if self.peek() == "(":
                raise TemplateError(f"{value}(...) in {{{self.text}}}: function calls are not allowed")
            return ("var", value)
        if value == "(":
            node = self.expr()
            if self.peek() != ")":
                raise TemplateError(f"missing ')' in {{{self.text}}}")
            self.at += 1
            return node
        raise TemplateError(f"unexpected {value!r} in {{{self.text}}}; allowed: {ALLOWED}")


def _variables(node: Node) -> set[str]:
    if node[0] == "var":
        return {node[1]}
    if node[0] == "int":
        return set()
    return set().union(*(_variables(child) for child in node[1:]))


def _evaluate(node: Node, env: Mapping[str, Value]) -> Value:
    kind = node[0]
    if kind == "int":
        return node[1]
    if kind == "var":
        return env[node[1]]  # presence is checked before rendering (Template.check)
    values = [_evaluate(child, env) for child in node[1:]]
    operands: list[int] = []
    for child, value in zip(node[1:], values, strict=True):
        if not isinstance(value, int):
            what = f"{child[1]!r} is text" if child[0] == "var" else "text"
            raise TemplateError(f"{what}: arithmetic works on integers only")
        operands.append(value)
    if kind == "neg":
        return _bounded(-operands[0])
    left, right = operands
    if kind in ("//", "%") and right == 0:
        raise TemplateError("division by zero")
    result = {"+": left + right, "-": left - right, "*": left * right}.get(kind)
    if result is None:
        result = left // right if kind == "//" else left % right
    return _bounded(result)


def _bounded(value: int) -> int:
    if abs(value) > MAX_VALUE:
        raise TemplateError(f"a template computes {'a huge' if value > 0 else 'a hugely negative'} number")
    return value


# --- templates ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Field:
    text: str  # the expression as written, for messages
    node: Node
    width: int | None  # zero-padded width, or None


@dataclass(frozen=True)
class Template:
    parts: tuple[str | _Field, ...]
    variables: frozenset[str]  # every variable the fields use (computed once: a pattern renders thousands of times)

    def check(self, known: Collection[str]) -> None:
        """Every variable the template uses is in `known` (raised once, before rendering many times)."""
        unknown = sorted(self.variables.difference(known))
        if unknown:
            names = ", ".join(f"{{{n}}}" for n in unknown)
            allowed = ", ".join(f"{{{n}}}" for n in sorted(known)) or "none"
            raise TemplateError(f"unknown placeholder {names} (known here: {allowed})")

    def render(self, env: Mapping[str, Value]) -> Value:
        if len(self.parts) == 1 and isinstance(self.parts[0], _Field) and self.parts[0].width is None:
            return _evaluate(self.parts[0].node, env)
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
                continue
            value = _evaluate(part.node, env)
            if part.width is not None:
                if not isinstance(value, int):
                    raise TemplateError(f"{{{part.text}:0{part.width}d}}: a width applies to integers only")
                sign, digits = ("-", str(-value)) if value < 0 else ("", str(value))
                value = sign + digits.rjust(part.width - len(sign), "0")
            out.append(str(value))
        return "".join(out)


_SPEC = re.compile(r"0(\d+)d")


@lru_cache(maxsize=4096)
def compile_template(text: str) -> Template:
    """Parse `text` (raises TemplateError). Cached: a pattern renders the same few templates thousands of times."""
    parts: list[str | _Field] = []
    literal: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c in "{}" and text[i : i + 2] == c * 2:
            literal.append(c)
            i += 2
            continue
        if c == "}":
            raise TemplateError(f"single '}}' in {text!r} (write }}}} for a literal brace)")
        if c != "{":
            literal.append(c)
            i += 1
            continue
        end = text.find("}", i + 1)
        if end < 0:
            raise TemplateError(f"'{{' without its '}}' in {text!r} (write {{{{ for a literal brace)")
        body = text[i + 1 : end]
        if "{" in body:
            raise TemplateError(f"nested '{{' in {text!r}")
        if literal:
            parts.append("".join(literal))
            literal = []
        parts.append(_field(body))
        i = end + 1
    if literal:
        parts.append("".join(literal))
    return Template(tuple(parts), frozenset().union(*(_variables(p.node) for p in parts if isinstance(p, _Field))))


def _field(body: str) -> _Field:
    if len(body) > MAX_EXPRESSION:
        raise TemplateError(f"a {{...}} of more than {MAX_EXPRESSION} characters")
    expression, colon, spec = body.partition(":")
    width = None
    if colon:
        m = _SPEC.fullmatch(spec.strip())
        if m is None:
            raise TemplateError(f"{{{body}}}: the only format is a zero-padded width such as :03d")
        width = int(m.group(1))
        if not 1 <= width <= MAX_WIDTH:
            raise TemplateError(f"{{{body}}}: a width is 1..{MAX_WIDTH}")
    return _Field(expression.strip(), _Parser(expression).parse(), width)


def render(text: str, env: Mapping[str, Value]) -> Value:
    """Compile, check and render in one go (for one-off use and tests)."""
    template = compile_template(text)
    template.check(env)
    return template.render(env)
