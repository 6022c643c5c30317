"""Replaying a NETCONF run (`testbed replay`, testbed/ops/audit_replay.py) through the switch's NETCONF server,
without SSH.

What the polatis-netconf driver records (drivers/netconf/polatis.py, docs/protocols.md §7.10 "audit"): each <rpc>
exactly as ncclient puts it on the wire as a "tx" record, each <rpc-reply> as received as "rx", and notes in
parentheses as "rx": `(NETCONF session N opened, base:1.1 framing; server capabilities: ...)` when a session opens,
`(timeout)` or `(connection lost: ...)` in place of a reply, `(connection failed: ...)` when opening one fails.
The replayer hands this session each tx with the text of every rx that followed it, concatenated.

How the replies are compared:
- as XML content, not bytes: both sides are parsed (defusedxml, as the server reads what it is sent) and written
  as canonical lines (`reply_lines`), so framing, the XML declaration, namespace prefixes, blank space between
  elements, the order of attributes, of a list's entries and of leaves (YANG's XML encoding leaves their order
  to the server) and the spelling of a decimal number (-1.00 = -1.0) do not count; a different element, leaf
  value, attribute or namespace does. A different cross-connect or power reading is a different line;
- the message-id: the recorded <rpc> is what the emulator is fed, and it copies the rpc's attributes into its reply
  (RFC 6241 §4.2, docs/protocols.md §7.5), so both replies carry the same id and it is compared;
- switch-motion (the project's module, docs/protocols.md §7.8) says only when the mirrors settle:
  `settle-remaining-us` is compared as present, not by value, and `moving-port` is left out. The answer's `at` is
  when the emulator's mirrors settle: the driver asks again only after sleeping that long, so what it sends next
  is fed no earlier, as after an SCPI `*OPC?` (testbed/ops/audit_replay.py's rules); nothing else in a reply depends on
  time except opm-power, which the emulator reads at the recorded moment;
- a reply the driver never got: `(timeout)` is "timing" (it only says the switch was slow); a lost connection,
  or no reply recorded at all (the run stopped mid-RPC), is "skip": nothing to compare;
- the hellos are not compared. The first session's note precedes every message, and the replayer keeps only
  what follows a message; a later one lands among the replies of whatever message preceded the reconnect,
  which this session cannot know while answering it. Its session-id depends on how many sessions the real
  server had served, and what the capabilities decide (the list name `pair`/`pairs`, switch-motion) shows in
  the replies anyway. The emulator's session is opened with a client hello of both base versions, as ncclient
  sends (docs/protocols.md §7.3, §7.4).

Edit-config: the front end answers <ok/> as soon as the change is applied to the model (the mirrors move after
it, docs/protocols.md §7.6 and §7.8), so its `at` is the moment it was fed.

Sessions: a close-session reply ends the emulator's session and the next message opens a new one (the lock of
`running` goes with it, RFC 6241 §7.5). A session the driver dropped after a timeout or a lost connection is not
seen here (exchange() is called before the replies are read); only the lock depends on the session, and
polatis-netconf never locks.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from typing import Any

from emulators.netconf.protocol import BASE_10, BASE_11, MOTION_NS, NC_NS, OPSW_NS, XML_NS, RpcError
from emulators.netconf.server import NetconfOptions, NetconfServer, ServerSession
from emulators.netconf.xmltree import parse_xml, split
from emulators.scpi.replay import Exchange

# The client hello the emulator's session is opened with: both base versions, as ncclient's default device
# handler advertises (docs/protocols.md §7.4, [T]).
CLIENT_HELLO = (
    f'<hello xmlns="{NC_NS}"><capabilities><capability>{BASE_10}</capability>'
    f"<capability>{BASE_11}</capability></capabilities></hello>"
).encode()
_PREFIXES = {NC_NS: "nc", OPSW_NS: "opsw", MOTION_NS: "motion", XML_NS: "xml"}
# The optical-switch lists' keys (docs/protocols.md §7.5): written first, so a line reads "ingress=1 egress=33".
_KEYS = frozenset({"ingress", "port-id"})
_SETTLE = f"{{{MOTION_NS}}}settle-remaining-us"
_MOVING = f"{{{MOTION_NS}}}moving-port"
# The driver's notes (drivers/netconf/polatis.py): one starts where the previous record ended (the replies of a
# message are concatenated), i.e. at the start of the text or right after a `>` or a `)`.
_NOTE = re.compile(r"\((?:NETCONF session \S+ opened|timeout\)|connection lost: |connection failed: )")
_DECIMAL = re.compile(r"([+-]?)([0-9]+)\.([0-9]+)")
_DIGITS = re.compile(r"([0-9]+)")
_BARE = re.compile(r"[^\s\"'=\[\]]+")
TIMEOUT = "(timeout)"


class NetconfReplay:
    """The NETCONF front end's replay session (the shape testbed.ops.audit_replay.ReplaySession names): recorded <rpc>s
    in, <rpc-reply>s out, compared as canonical lines.
    """

    def __init__(self, engine: Any, options: NetconfOptions | None = None) -> None:
        self._now = 0.0
        # The server's clock is the replay's: power readings and switch-motion are taken at the recorded moment.
        self.server = NetconfServer(engine, options, clock=lambda: self._now)
        self.session: ServerSession | None = None

    def exchange(self, message: str, now: float) -> Exchange:
        self._now = now
        if self.session is None:
            self.session = self.server.new_session()
            self.session.handle_hello(CLIENT_HELLO)
        reply = self.session.handle(message.encode("utf-8", errors="surrogatepass"))
        at = now
        if reply.close:  # close-session: the front end closes after sending it
            self.session.end()
            self.session = None
        if reply.xml is None:
            return Exchange([], at)
        try:
            root = parse_xml(reply.xml)
        except RpcError as exc:  # the emulator's own reply unreadable: a bug, shown as a disagreement
            return Exchange([f"(unreadable XML: {exc.message})"], at)
        settle = root.find(f".//{_SETTLE}")
        remaining = "" if settle is None else (settle.text or "").strip()
        if remaining.isdigit():
            at = now + int(remaining) / 1e6  # the driver asks again once it has slept this long
        return Exchange(canonical_lines(root), at)

    def recorded(self, text: str) -> list[str]:
        """The reply as canonical lines; a message without one: its first note, `(timeout)` or
        `(connection lost: ...)`; nothing if nothing was recorded. Notes after a reply (a session opened or
        failing to open before the next message) are not about this message and are left out.
        """
        reply, notes = split_records(text)
        if reply.strip():
            return reply_lines(reply)
        for note in notes:
            if not note.startswith("(NETCONF session"):
                return [note]
        return []

    def verdict(self, message: str, recorded: list[str], emulated: list[str]) -> str:
        """Every reply is compared (NETCONF answers every RPC, RFC 6241 §4.2: an edit's <ok/> too); one the
        driver gave up waiting for is "timing"; a lost connection, or nothing recorded, is "skip".
        """
        first = recorded[0] if recorded else ""
        if first == TIMEOUT:
            return "timing"
        if not recorded or first.startswith("(connection "):
            return "skip"
        return "compare"


def split_records(text: str) -> tuple[str, list[str]]:
    """The concatenated rx text of one message -> (its <rpc-reply>, the driver's notes after it). The reply, when
    there is one, comes first: the driver records it, or a note in its place, before anything else.
    """
    starts = [m.start() for m in _NOTE.finditer(text) if m.start() == 0 or text[m.start() - 1] in ">)"]
    if not starts:
        return text, []
    cut = starts[0]
    if cut > 0:
        # A reply whose text holds something like a note (an error-message saying "(timeout)") is not cut there:
        # the reply ends at the first candidate before which it is whole XML (else at the first candidate).
        cut = next((c for c in [*starts, len(text)] if _well_formed(text[:c])), cut)
    reply, rest = text[:cut], text[cut:]
    bounds = [s - cut for s in starts if s >= cut] + [len(rest)]
    notes = [rest[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if rest[a:b]]
    return reply, notes


def _well_formed(text: str) -> bool:
    try:
        parse_xml(text.encode("utf-8", errors="surrogatepass"))
    except RpcError:
        return False
    return True


def reply_lines(text: str | bytes) -> list[str]:
    """One reply's XML as canonical lines; unreadable XML as one line saying why."""
    data = text.encode("utf-8", errors="surrogatepass") if isinstance(text, str) else text
    try:
        root = parse_xml(data.strip())
    except RpcError as exc:
        return [f"(unreadable XML: {exc.message})"]
    return canonical_lines(root)


def canonical_lines(root: ET.Element) -> list[str]:
    """An element tree as lines: one per element that has child elements, `path[attributes]: leaf=value ...`,
    with the leaves (child elements without children) sorted, list keys first, then the blocks of its other
    children, sorted.
    Names carry a prefix where the namespace changes (nc, opsw, motion, else {uri}); the root's parent namespace is
    NETCONF's. Leaf text is stripped; blank text between elements is formatting.
    """
    return _block(root, NC_NS, "")


def _block(elem: ET.Element, parent_ns: str | None, path: str) -> list[str]:
    ns = split(elem.tag)[0]
    here = f"{path}/{_name(elem.tag, parent_ns)}" if path else _name(elem.tag, parent_ns)
    leaves = [(split(c.tag)[1] not in _KEYS, _leaf(c, ns)) for c in elem if not len(c) and c.tag != _MOVING]
    items = [leaf for _, leaf in sorted(leaves, key=lambda kl: (kl[0], _natural(kl[1])))]
    # Text beside child elements (mixed content) is not expected in NETCONF, but not to be lost either; a root
    # without children has its text here too.
    pieces = [elem.text, *(child.tail for child in elem)]
    text = " ".join(p.strip() for p in pieces if p and p.strip())
    if text:
        items.insert(0, f"#text={_value(text)}")
    line = here + _attrs(elem) + (": " + " ".join(items) if items else "")
    blocks = sorted((_block(c, ns, here) for c in elem if len(c)), key=lambda block: [_natural(x) for x in block])
    return [line] + [x for block in blocks for x in block]


def _natural(line: str) -> list:
    """Sort key: numbers by value (port 9 before port 10), the rest as text."""
    return [int(part) if i % 2 else part for i, part in enumerate(_DIGITS.split(line))]


def _leaf(elem: ET.Element, parent_ns: str | None) -> str:
    name = _name(elem.tag, parent_ns) + _attrs(elem)
    if elem.tag == _SETTLE:
        return f"{name}=(when)"  # says only when: see the module's docstring
    text = (elem.text or "").strip()
    return f"{name}={_value(text)}" if text else name


def _name(tag: str, parent_ns: str | None) -> str:
    ns, local = split(tag)
    if ns == parent_ns:
        return local
    prefix = _PREFIXES.get(ns) if ns else None
    return f"{prefix}:{local}" if prefix else f"{{{ns or ''}}}{local}"


def _attrs(elem: ET.Element) -> str:
    if not elem.attrib:
        return ""
    items = sorted(f"{_name(key, None) if key.startswith('{') else key}={_value(v)}" for key, v in elem.attrib.items())
    return "[" + " ".join(items) + "]"


def _value(text: str) -> str:
    m = _DECIMAL.fullmatch(text)
    if m:  # YANG decimal64's canonical form: no "+", no leading or trailing zeros beyond one digit each side
        sign, whole, frac = m.group(1), m.group(2).lstrip("0") or "0", m.group(3).rstrip("0") or "0"
        sign = "" if sign == "+" or (whole == "0" and frac == "0") else sign
        text = f"{sign}{whole}.{frac}"
    return text if _BARE.fullmatch(text) else json.dumps(text, ensure_ascii=False)
