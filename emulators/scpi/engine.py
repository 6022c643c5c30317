"""A transport-free SCPI / IEEE 488.2 protocol engine, the base of every SCPI-speaking emulator.

The engine owns the device-wide state every SCPI instrument has (error queue, status registers, the
command tree); a `Session` owns what belongs to one client conversation (path memory, reply ordering,
*WAI hold). Endpoints give each connection its own Session; `ScpiEngine.handle` uses a default one.

Time is never read from a clock here: every call passes `now`, and replies carry the earliest absolute
time (same clock) at which the transport may send them. So unit tests run in virtual time and the
adapters decide how to wait (loop.call_at in emulators/endpoints.py).

Decisions where the standards leave room (documented in the tests too):
- After an error in one message unit the remaining units of the message still execute (lenient: a
  dropped `*OPC?` would turn a driver bug into a timeout, which is harder to diagnose).
- A query that fails produces no response (IEEE 488.2), only the error-queue entry.
- `*OPC?` also holds the later commands of its conversation until operations complete (as `*WAI`
  does; instrument manuals describe *OPC? as blocking), so a query pipelined behind it sees the
  settled state. Other conversations are not held.
- -410 Query INTERRUPTED: over a byte stream the device cannot know whether the client has *read* a
  reply, only whether it has been *sent*. With `query_interrupt=True` a new message arriving while an
  earlier reply is still waiting for its send time (e.g. `*OPC?` during a move) cancels that reply and
  queues -410. Off by default: it is unknown whether Polatis firmware does this.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

ERROR_TEXT = {
    0: "No error",
    -100: "Command error",
    -101: "Invalid character",
    -102: "Syntax error",
    -108: "Parameter not allowed",
    -109: "Missing parameter",
    -113: "Undefined header",
    -200: "Execution error",
    -221: "Settings conflict",
    -222: "Data out of range",
    -224: "Illegal parameter value",
    -300: "Device-specific error",
    -350: "Queue overflow",
    -363: "Input buffer overrun",
    -410: "Query INTERRUPTED",
}

# *ESR? bits (IEEE 488.2 11.5.1) and *STB? bits (11.2).
ESR_OPC, ESR_QYE, ESR_DDE, ESR_EXE, ESR_CME, ESR_PON = 1, 4, 8, 16, 32, 128
STB_EAV, STB_ESB, STB_MSS = 4, 32, 64

MAX_CHANNELS = 65536  # a range like (@1:999999999) must not allocate a billion ints


class ScpiError(Exception):
    """Raised by handlers and parsers; the engine turns it into an error-queue entry."""

    def __init__(self, code: int, detail: str = ""):
        self.code = code
        self.detail = detail
        super().__init__(format_error(code, detail))


def format_error(code: int, detail: str = "") -> str:
    # The description is a quoted string: keep it printable and free of quotes, and short.
    text = ERROR_TEXT.get(code, "Error")
    if detail:
        clean = "".join(c if " " <= c < "\x7f" and c != '"' else "?" for c in detail)[:80]
        text = f"{text};{clean}"
    return f'{code},"{text}"'


@dataclass(eq=False)
class Reply:
    """Bytes to send, and the earliest absolute time (the caller's clock) to send them at."""

    data: bytes
    at: float
    cancelled: bool = False  # set by the engine on -410; transports skip cancelled replies


@dataclass
class Call:
    """What a handler gets: the effective time, the raw parameters and the header's numeric suffixes.

    suffixes[k] belongs to the k-th node from the root, 1 where the node takes none or it was omitted.
    """

    now: float
    args: list[str]
    suffixes: tuple[int, ...]
    session: Session


# A handler returns None (set command), a str (answered at call.now) or (str, at) for a later answer.
Answer = str | tuple[str, float] | None
Handler = Callable[[Call], Answer]


@dataclass
class _Entry:
    fn: Handler
    min_args: int
    max_args: int


class _Node:
    """One node of the command tree, e.g. SWITch: matches SWIT or SWITCH (any case), nothing between."""

    def __init__(self, spelling: str = ""):
        self.suffixed = spelling.endswith("#")
        word = spelling.rstrip("#")
        self.long = word.upper()
        self.short = re.match(r"[A-Z0-9_]*", word).group(0) or self.long  # type: ignore[union-attr]  # `*` always matches
        self.children: list[_Node] = []
        self.set: _Entry | None = None
        self.query: _Entry | None = None

    def match(self, mnemonic: str) -> int | None:
        """The numeric suffix (1 if omitted) if `mnemonic` names this node, else None."""
        word, suffix = mnemonic.upper(), 1
        if self.suffixed:
            m = re.fullmatch(r"(.*?)(\d{1,6})", word)
            if m:
                word, suffix = m.group(1), int(m.group(2))
        return suffix if word in (self.short, self.long) else None

    def child(self, spelling: str) -> _Node:
        for c in self.children:
            if c.long == spelling.rstrip("#").upper():
                return c
        node = _Node(spelling)
        self.children.append(node)
        return node


_HEADER_RE = re.compile(r":?[A-Za-z][A-Za-z0-9_]*(?::[A-Za-z][A-Za-z0-9_]*)*\??")
_COMMON_RE = re.compile(r"\*[A-Za-z]+\??")
_PATTERN_NODE_RE = re.compile(r"\[:?([A-Za-z0-9_#]+)\]|:?([A-Za-z0-9_#]+)")


_PARENS_RE = re.compile(r"([()])")


def split_top_level(text: str, sep: str) -> list[str]:
    """Split on `sep` outside parentheses and quoted strings ('...' or "...", doubled quote escapes)."""
    if sep not in text:
        return [text]
    if "'" not in text and '"' not in text:
        return _split_outside_parens(text, sep)
    return _split_top_level_chars(text, sep)


def _split_outside_parens(text: str, sep: str) -> list[str]:
    """split_top_level without quotes: only parentheses matter, so the text between them is split by
    str.split. A 256-port channel list is one piece here, not 2,000 steps of a character loop (a rail
    change on eight 256-port switches is parsed by one twin process).
    """
    parts: list[str] = []
    current: list[str] = []  # pieces of the part being built
    depth = 0
    for piece in _PARENS_RE.split(text):
        if piece == "(":
            depth += 1
        elif piece == ")":
            depth = max(0, depth - 1)
        elif depth == 0 and sep in piece:
            first, *rest = piece.split(sep)
            parts.append("".join(current) + first)
            parts.extend(rest[:-1])
            current = [rest[-1]]
            continue
        current.append(piece)
    parts.append("".join(current))
    return parts


def _split_top_level_chars(text: str, sep: str) -> list[str]:
    parts, start, depth, quote = [], 0, 0, ""
    for i, c in enumerate(text):
        if quote:
            if c == quote:
                quote = ""  # a doubled quote re-enters on the next char, which is equivalent
        elif c in "'\"":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth = max(0, depth - 1)
        elif c == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def parse_args(text: str) -> list[str]:
    """Comma-separated program data; an empty element (`1,,2`, `(@1),`) is a syntax error."""
    text = text.strip()
    if not text:
        return []
    args = [a.strip() for a in split_top_level(text, ",")]
    if any(not a for a in args):
        raise ScpiError(-102, "empty parameter")
    return args


def parse_int(text: str) -> int:
    try:
        value = float(text)
        if not value.is_integer():
            raise ValueError
        return int(value)
    except (ValueError, OverflowError):
        raise ScpiError(-224, f"not an integer: {text[:20]}") from None


def parse_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ScpiError(-224, f"not a number: {text[:20]}") from None
    if not math.isfinite(value):
        raise ScpiError(-224, "not a finite number")
    return value


def parse_choice(text: str, choices: list[str]) -> str:
    """Match an enumerated value given in SCPI long/short form (e.g. RESTore); returns its long form."""
    for choice in choices:
        node = _Node(choice)
        if node.match(text) is not None:
            return node.long
    raise ScpiError(-224, f"expected one of {','.join(choices)}")


_CHANNEL_LIST_RE = re.compile(r"\(\s*@(.*)\)", re.S)
_PLAIN_CHANNELS_RE = re.compile(r"\s*\d{1,9}\s*(?:,\s*\d{1,9}\s*)*")
_CHANNEL_RE = re.compile(r"\d{1,9}")


def parse_channel_list(text: str, *, allow_ranges: bool = True) -> list[int]:
    """`(@1,2,3)`, `(@1, 2, 3)`, `(@)` and, if allowed, ranges `(@1:4)` / `(@4:1)`."""
    m = _CHANNEL_LIST_RE.fullmatch(text.strip())
    if not m:
        raise ScpiError(-102, "expected a channel list (@...)")
    body = m.group(1).strip()
    if not body:
        return []
    if _PLAIN_CHANNELS_RE.fullmatch(body):  # no ranges: one match checks every channel at once
        if body.count(",") >= MAX_CHANNELS:
            raise ScpiError(-224, "channel list too long")
        return [int(item) for item in body.split(",")]
    ports: list[int] = []
    for item in body.split(","):
        lo, sep, hi = item.strip().partition(":")
        if sep and not allow_ranges:
            raise ScpiError(-102, "channel ranges are not supported")
        if not _CHANNEL_RE.fullmatch(lo.strip()) or (sep and not _CHANNEL_RE.fullmatch(hi.strip())):
            raise ScpiError(-102, f"bad channel {item.strip()[:20]}")
        a, b = int(lo), int(hi) if sep else int(lo)
        if len(ports) + abs(b - a) + 1 > MAX_CHANNELS:
            raise ScpiError(-224, "channel list too long")
        ports.extend(range(a, b + 1) if a <= b else range(a, b - 1, -1))
    return ports


class Session:
    """One client conversation: path memory, reply ordering, *WAI hold, replies not yet sent."""

    def __init__(self, engine: ScpiEngine):
        self.engine = engine
        self._forget()

    def _forget(self) -> None:
        self.epoch = self.engine.epoch
        self.last_at = -math.inf  # replies on one conversation are never reordered
        self.hold_until = -math.inf  # *WAI / *OPC?: later units take effect no earlier than this
        self.pending: list[Reply] = []
        self._path: tuple[_Node, tuple[int, ...]] = (self.engine.root, ())

    def handle(self, line: str, now: float) -> list[Reply]:
        """Execute one program message (one line, terminator removed). Never raises."""
        try:
            return self._handle(line, now)
        except Exception as exc:  # a bug must not kill the connection: report it like a device would
            self.engine.push_error(-300, f"internal {type(exc).__name__}")
            return []

    def _handle(self, line: str, now: float) -> list[Reply]:
        engine = self.engine
        if self.epoch != engine.epoch:  # the device was reset by the control API
            self._forget()
        units = [u.strip() for u in split_top_level(line, ";")]
        if not any(units):
            return []  # an empty message (blank line, lone ';') is not a command
        self.pending = [r for r in self.pending if r.at > now and not r.cancelled]
        if engine.query_interrupt and self.pending:
            for r in self.pending:
                r.cancelled = True
            self.pending = []
            engine.push_error(-410, "reply discarded")
        self._path = (engine.root, ())  # path memory lasts for one program message
        answers: list[tuple[str, float]] = []
        for unit in units:
            if not unit:
                continue  # e.g. the redundant ';' some drivers send before the terminator
            eff = max(now, self.hold_until)
            try:
                answer = engine._execute(unit, eff, self)
            except ScpiError as err:
                engine.push_error(err.code, err.detail)
                continue
            except Exception as exc:
                engine.push_error(-300, f"internal {type(exc).__name__}")
                continue
            if answer is not None:
                text, at = (answer, eff) if isinstance(answer, str) else answer
                at = max(at, eff, self.last_at)
                self.last_at = at
                answers.append((text, at))
        if not answers:
            return []
        term = engine.terminator
        if engine.join_compound:
            batches = [(";".join(t for t, _ in answers), answers[-1][1])]
        else:
            batches = answers
        replies = [Reply((t + term).encode("latin-1", "replace"), at) for t, at in batches]
        self.pending.extend(r for r in replies if r.at > now)
        return replies


class ScpiEngine:
    """Command tree + IEEE 488.2 common commands + error queue. Subclass and `register` commands."""

    def __init__(
        self,
        idn: str,
        *,
        error_queue_size: int = 30,
        join_compound: bool = False,
        terminator: str = "\r\n",
        query_interrupt: bool = False,
    ):
        self.idn = idn
        self.error_queue_size = error_queue_size
        self.join_compound = join_compound
        self.terminator = terminator
        self.query_interrupt = query_interrupt
        self.root = _Node()
        self.commons: dict[str, _Entry] = {}
        self.errors: deque[tuple[int, str]] = deque()
        self.epoch = 0  # bumped by reset_status(); sessions then drop their holds
        self.reset_status()
        self._default_session = Session(self)
        self._register_ieee488()

    # ---- registration -------------------------------------------------------------------------

    def register(self, pattern: str, fn: Handler, *, args: tuple[int, int] = (0, 0)) -> None:
        """Register e.g. ":OXC:SWITch:CONNect:ADD" (args=(2, 3)), "SYSTem:ERRor[:NEXT]?" or "*IDN?".

        Uppercase letters are the short form; `[:NODE]` is optional (a default node); a trailing `#`
        on a node accepts a numeric suffix (passed in Call.suffixes); a trailing `?` makes a query.
        """
        entry = _Entry(fn, *args)
        if pattern.startswith("*"):
            self.commons[pattern.upper()] = entry
            return
        is_query = pattern.endswith("?")
        nodes = _PATTERN_NODE_RE.findall(pattern.rstrip("?"))
        variants: list[list[str]] = [[]]
        for optional, required in nodes:
            if optional:
                variants = variants + [v + [optional] for v in variants]
            else:
                variants = [v + [required] for v in variants]
        for spellings in variants:
            node = self.root
            for spelling in spellings:
                node = node.child(spelling)
            if is_query:
                node.query = entry
            else:
                node.set = entry

    # ---- the interface used by transports -----------------------------------------------------

    def new_session(self) -> Session:
        return Session(self)

    def handle(self, line: str, now: float) -> list[Reply]:
        return self._default_session.handle(line, now)

    def input_overrun(self) -> None:
        """A transport dropped an over-long line."""
        self.push_error(-363, "line too long")

    # ---- hooks for device engines -------------------------------------------------------------

    def operations_complete_at(self, now: float) -> float:
        """When all pending operations complete (drives *OPC?, *OPC, *WAI). Default: immediately."""
        return now

    def reset_device(self, now: float) -> None:
        """*RST: put the device settings in their reset state."""

    # ---- error queue and status ---------------------------------------------------------------

    def push_error(self, code: int, detail: str = "") -> None:
        if -199 <= code <= -100:
            self.esr |= ESR_CME
        elif -299 <= code <= -200:
            self.esr |= ESR_EXE
        elif -399 <= code <= -300 or code > 0:
            self.esr |= ESR_DDE
        elif -499 <= code <= -400:
            self.esr |= ESR_QYE
        if len(self.errors) >= self.error_queue_size:
            # SCPI-99 21.8: the newest entry is replaced by -350, further errors are lost.
            self.errors[-1] = (-350, format_error(-350))
        else:
            self.errors.append((code, format_error(code, detail)))

    def pop_error(self) -> str:
        return self.errors.popleft()[1] if self.errors else format_error(0)

    def reset_status(self) -> None:
        """Back to power-on status: empty error queue, cleared registers, no pending *OPC."""
        self.errors.clear()
        self.esr = self.ese = self.sre = 0
        self.opc_at: float | None = None
        self.epoch += 1

    def _update_opc(self, now: float) -> None:
        if self.opc_at is not None and now >= self.opc_at:
            self.esr |= ESR_OPC
            self.opc_at = None

    # ---- execution ----------------------------------------------------------------------------

    def _execute(self, unit: str, now: float, session: Session) -> Answer:
        header, _, rest = unit.replace("\t", " ").partition(" ")
        if _COMMON_RE.fullmatch(header):
            entry = self.commons.get(header.upper())  # common commands leave the path alone
            suffixes: tuple[int, ...] = ()
        elif _HEADER_RE.fullmatch(header):
            entry, suffixes = self._resolve(header, session)
        else:
            raise ScpiError(-102, f"bad header {header[:20]}")
        if entry is None:
            raise ScpiError(-113, header[:40])
        args = parse_args(rest)
        if len(args) < entry.min_args:
            raise ScpiError(-109, header[:40])
        if len(args) > entry.max_args:
            raise ScpiError(-108, header[:40])
        return entry.fn(Call(now, args, suffixes, session))

    def _resolve(self, header: str, session: Session) -> tuple[_Entry | None, tuple[int, ...]]:
        is_query = header.endswith("?")
        mnemonics = header.strip(":?").split(":")
        node, suffixes = (self.root, ()) if header.startswith(":") else session._path
        trail = []
        for mnemonic in mnemonics:
            for child in node.children:
                suffix = child.match(mnemonic)
                if suffix is not None:
                    break
            else:
                return None, ()
            trail.append((node, suffixes))
            suffixes = (*suffixes, suffix)
            node = child
        # SCPI path memory: the next unit resolves relative to the leaf's parent (suffixes included).
        session._path = trail[-1]
        return (node.query if is_query else node.set), suffixes

    # ---- IEEE 488.2 common commands and the SCPI SYSTem:ERRor subsystem -----------------------

    def _register_ieee488(self) -> None:
        def byte_register(name: str) -> Handler:
            def setter(call: Call) -> None:
                value = parse_int(call.args[0])
                if not 0 <= value <= 255:
                    raise ScpiError(-222, f"{name} must be 0..255")
                setattr(self, name, value)

            return setter

        def esr_query(call: Call) -> str:
            self._update_opc(call.now)
            value, self.esr = self.esr, 0
            return str(value)

        def stb_query(call: Call) -> str:
            self._update_opc(call.now)
            stb = (STB_EAV if self.errors else 0) | (STB_ESB if self.esr & self.ese else 0)
            return str(stb | (STB_MSS if stb & self.sre & ~STB_MSS else 0))

        def opc_set(call: Call) -> None:
            self.opc_at = self.operations_complete_at(call.now)

        def wai(call: Call) -> None:
            call.session.hold_until = max(call.session.hold_until, self.operations_complete_at(call.now))

        def opc_query(call: Call) -> Answer:
            # Like *WAI, later commands on this conversation wait too (instruments document *OPC? as
            # blocking), so a query pipelined behind it measures the settled state.
            wai(call)
            return ("1", self.operations_complete_at(call.now))

        def cls(call: Call) -> None:
            self.errors.clear()
            self.esr = 0
            self.opc_at = None

        def error_all(call: Call) -> str:
            if not self.errors:
                return format_error(0)
            out = ",".join(text for _, text in self.errors)
            self.errors.clear()
            return out

        reg = self.register
        reg("*IDN?", lambda c: self.idn)
        reg("*RST", lambda c: self.reset_device(c.now))
        reg("*CLS", cls)
        reg("*OPC", opc_set)
        reg("*OPC?", opc_query)
        reg("*WAI", wai)
        reg("*ESR?", esr_query)
        reg("*ESE", byte_register("ese"), args=(1, 1))
        reg("*ESE?", lambda c: str(self.ese))
        reg("*SRE", byte_register("sre"), args=(1, 1))
        reg("*SRE?", lambda c: str(self.sre))
        reg("*STB?", stb_query)
        reg("*TST?", lambda c: "0")
        reg(":SYSTem:ERRor[:NEXT]?", lambda c: self.pop_error())
        reg(":SYSTem:ERRor:ALL?", error_all)
        reg(":SYSTem:ERRor:COUNt?", lambda c: str(len(self.errors)))
        reg(":SYSTem:VERSion?", lambda c: "1999.0")
