"""The NETCONF server's framing and XML handling under hostile input: whatever arrives, a session answers with an
rpc-error or is closed, never crashes and never hangs. First the pure parts (emulators/netconf/framing.py and
server.py) under hypothesis, then the same faults over a real SSH channel (a raw paramiko client).
"""

from __future__ import annotations

import re
import time

import defusedxml.ElementTree as SafeET
import paramiko
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulators.netconf.framing import EOM, FrameReader, FramingError, frame
from emulators.netconf.server import NetconfServer
from emulators.scpi.ocs import PolatisEngine
from emulators.spec import OcsSpec

NC = "urn:ietf:params:xml:ns:netconf:base:1.0"
OPSW = "http://www.polatis.com/yang/optical-switch"
TAGS = {
    "in-use",
    "invalid-value",
    "too-big",
    "missing-attribute",
    "bad-attribute",
    "unknown-attribute",
    "missing-element",
    "bad-element",
    "unknown-element",
    "unknown-namespace",
    "access-denied",
    "lock-denied",
    "resource-denied",
    "rollback-failed",
    "data-exists",
    "data-missing",
    "operation-not-supported",
    "operation-failed",
    "malformed-message",
}  # fmt: skip  (RFC 6241 Appendix A)
BILLION_LAUGHS = (
    '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
    + "".join(f'<!ENTITY lol{i} "{("&lol" + (str(i - 1) if i > 1 else "") + ";") * 10}">' for i in range(1, 10))
    + f']><rpc xmlns="{NC}" message-id="1"><get><filter><x>&lol9;</x></filter></get></rpc>'
).encode()
XXE = f'<?xml version="1.0"?><!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]><rpc xmlns="{NC}" message-id="1">'
XXE += "&x;</rpc>"
EXTERNAL_DTD = (
    f'<?xml version="1.0"?><!DOCTYPE rpc SYSTEM "http://127.0.0.1:9/x.dtd"><rpc xmlns="{NC}" message-id="1"/>'
)


def session(base11: bool = True, size: int = 4):
    engine = PolatisEngine(OcsSpec(name="f", size=size, switching_time_ms=0, jitter_ms=0, input_power_dbm={1: 0.0}))
    s = NetconfServer(engine, clock=lambda: 0.0).new_session()
    s.base11 = base11
    return engine, s


def reply_tags(xml: bytes) -> list[str]:
    root = SafeET.fromstring(xml, forbid_dtd=True)  # every reply is plain, well-formed XML
    assert root.tag == f"{{{NC}}}rpc-reply"
    return [e.text for e in root.iter(f"{{{NC}}}error-tag")]


# -- framing ------------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(min_size=0, max_size=64), max_size=20), st.booleans())
def test_any_bytes_give_messages_or_a_framing_error(pieces, chunked):
    reader = FrameReader(max_message=256)
    reader.chunked = chunked
    try:
        for piece in pieces:
            reader.feed(piece)
            while (message := reader.next_message()) is not None:
                assert len(message) <= 256
            assert len(reader._buf) <= 256 + len(EOM) + 64  # never more than one message's worth held
    except FramingError as exc:
        assert exc.tag in ("malformed-message", "too-big")


MESSAGES = st.lists(st.binary(min_size=1, max_size=300).filter(lambda m: EOM not in m and m.strip()), max_size=5)


@settings(max_examples=200, deadline=None)
@given(MESSAGES, st.booleans(), st.integers(1, 64), st.integers(1, 50))
def test_framed_messages_come_back_whole_however_the_bytes_are_cut(messages, chunked, cut, max_chunk):
    wire = b"".join(frame(m, chunked, max_chunk) for m in messages)
    reader = FrameReader(max_message=1000)
    reader.chunked = chunked
    got = []
    for i in range(0, len(wire), cut):
        reader.feed(wire[i : i + cut])
        while (message := reader.next_message()) is not None:
            got.append(message)
    expected = messages if chunked else [m.strip(b" \t\r\n") for m in messages]
    assert got == [m for m in expected if m]
    assert not reader.in_message


@pytest.mark.parametrize(
    ("wire", "tag"),
    [
        (b"\n#0\nx\n##\n", "malformed-message"),  # size 0
        (b"\n#01\nx\n##\n", "malformed-message"),  # a leading zero
        (b"\n#4294967296\n", "malformed-message"),  # above the RFC 6242 maximum
        (b"\n#12345678901234\n", "malformed-message"),  # a header that never ends
        (b"\n#1x\n", "malformed-message"),
        (b"\n##\n", "malformed-message"),  # end of chunks without a chunk
        (b"\n#3\nabc\n#\n", "malformed-message"),
        (b"<rpc/>", "malformed-message"),  # 1.0 framing after both sides chose 1.1
        (b"\n#2000\n", "too-big"),  # a chunk larger than the message cap: refused before its bytes come
        (b"\n#600\n" + b"a" * 600 + b"\n#600\n", "too-big"),
    ],
)
def test_bad_chunked_framing(wire, tag):
    reader = FrameReader(max_message=1000)
    reader.chunked = True
    reader.feed(wire)
    with pytest.raises(FramingError) as info:
        while reader.next_message() is not None:
            pass
    assert info.value.tag == tag


def test_an_end_of_message_that_never_comes_is_too_big():
    reader = FrameReader(max_message=1000)
    for _ in range(20):
        reader.feed(b"<rpc>" + b"x" * 90)
        try:
            assert reader.next_message() is None
        except FramingError as exc:
            assert exc.tag == "too-big"
            return
    pytest.fail("1900 bytes without ]]>]]> were accepted under a 1000-byte cap")


# -- XML ------------------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)), st.booleans())
def test_any_message_gets_a_well_formed_rpc_error(message, base11):
    engine, s = session(base11)
    reply = s.handle(message)
    tags = reply_tags(reply.xml)
    assert tags and set(tags) <= TAGS and not reply.close
    assert ("malformed-message" in tags) <= base11  # a base:1.0 peer gets operation-failed instead
    assert engine.circuits() == {}


NAMES = ["rpc", "get", "get-config", "edit-config", "filter", "source", "target", "running", "config",
         "cross-connects", "pair", "pairs", "ingress", "egress", "opm-power", "port", "port-id", "power",
         "port-config", "status", "lock", "unlock", "default-operation", "port-set-state", "port-enab"]  # fmt: skip
NAMESPACES = ["", f' xmlns="{NC}"', f' xmlns="{OPSW}"', ' xmlns="urn:x"']
ATTRS = ["", ' message-id="1"', ' operation="delete"', f' xmlns:nc="{NC}" nc:operation="merge"', ' type="xpath"']


def xml_trees(depth: int = 3):
    leaf = st.one_of(st.sampled_from(["", "1", "5", "x", "merge", " 2 ", "&amp;", "<running/>"]))

    def node(children):
        return st.builds(
            lambda name, ns, attr, body: f"<{name}{ns}{attr}>{''.join(body)}</{name}>",
            st.sampled_from(NAMES), st.sampled_from(NAMESPACES), st.sampled_from(ATTRS), st.lists(children, max_size=4),
        )  # fmt: skip

    return st.recursive(leaf, node, max_leaves=25)


@settings(max_examples=300, deadline=None)
@given(xml_trees(), st.sampled_from(["get", "get-config", "edit-config", "lock", "port-set-state", "commit"]))
def test_structured_nonsense_is_answered(body, op):
    engine, s = session()
    ns = f' xmlns="{OPSW}"' if op == "port-set-state" else ""
    reply = s.handle(f'<rpc xmlns="{NC}" message-id="9"><{op}{ns}>{body}</{op}></rpc>'.encode())
    tags = reply_tags(reply.xml)
    assert set(tags) <= TAGS
    assert b'message-id="9"' in reply.xml  # every reply is matched to its request


@pytest.mark.parametrize("message", [BILLION_LAUGHS, XXE.encode(), EXTERNAL_DTD.encode()])
@pytest.mark.parametrize("base11", [True, False])
def test_dtds_and_entities_are_refused(message, base11):
    _, s = session(base11)
    # Refused, not expanded: expanding the billion laughs would not return (pytest-timeout fails it) or would
    # answer something else; no wall-clock bound is needed.
    tags = reply_tags(s.handle(message).xml)
    assert tags == (["malformed-message"] if base11 else ["operation-failed"])


def test_deep_nesting_is_harmless():
    _, s = session()
    deep = "<a>" * 50_000 + "</a>" * 50_000
    reply = s.handle(f'<rpc xmlns="{NC}" message-id="1"><get><filter>{deep}</filter></get></rpc>'.encode())
    assert reply_tags(reply.xml) == [] and b"<data></data>" in reply.xml


def test_a_bad_hello_ends_the_session():
    from emulators.netconf.server import SessionEnd

    hellos = [
        b"<rpc/>",
        b"not xml",
        f'<hello xmlns="{NC}"><session-id>4</session-id></hello>'.encode(),  # a client must not send one
        f'<hello xmlns="{NC}"><capabilities><capability>x</capability></capabilities></hello>'.encode(),  # no base
    ]
    for hello in hellos:
        with pytest.raises(SessionEnd):
            session()[1].handle_hello(hello)


# -- subtree filters (RFC 6241 §6) ----------------------------------------------------------------------


def get(s, filter_xml: str) -> str:
    return s.handle(f'<rpc xmlns="{NC}" message-id="1"><get><filter>{filter_xml}</filter></get></rpc>'.encode()).xml


def test_subtree_filters():
    engine, s = session()
    engine.replace_circuits([(1, 5), (2, 6)], 0.0)
    one_pair = get(s, f'<cross-connects xmlns="{OPSW}"><pair><ingress>2</ingress></pair></cross-connects>').decode()
    assert re.findall(r"<pair>.*?</pair>", one_pair) == ["<pair><ingress>2</ingress><egress>6</egress></pair>"]
    power = get(s, f'<opm-power xmlns="{OPSW}"><port><port-id>5</port-id><power/></port></opm-power>').decode()
    assert "<port><port-id>5</port-id><power>-1.00</power></port>" in power and "<port-id>1<" not in power
    anywhere = get(s, "<cross-connects/>").decode()  # no namespace: matches any
    assert anywhere.count("<pair>") == 2
    assert b"<data></data>" in get(s, "")  # an empty filter selects nothing
    assert b"<data></data>" in get(
        s, f'<cross-connects xmlns="{OPSW}"><pair><ingress>3</ingress></pair></cross-connects>'
    )
    assert b"<data></data>" in get(s, '<cross-connects xmlns="urn:other"/>')
    states = get(s, f'<port-config xmlns="{OPSW}"><port><port-id>1</port-id></port><port><port-id>8</port-id></port>'
                 "</port-config>").decode()  # fmt: skip
    assert re.findall(r"<port-id>(\d+)</port-id><status>(\w+)</status>", states) == [("1", "ENABLED"), ("8", "ENABLED")]


# -- over SSH -------------------------------------------------------------------------------------------

HELLO_11 = (
    f'<hello xmlns="{NC}"><capabilities><capability>urn:ietf:params:netconf:base:1.1</capability>'
    "</capabilities></hello>]]>]]>"
).encode()


class RawClient:
    """paramiko straight to the subsystem: the bytes on the channel are the test's, framing included."""

    def __init__(self, endpoints: dict) -> None:
        host, _, port = endpoints["netconf"].rpartition(":")
        self.ssh = paramiko.SSHClient()
        self.ssh.load_host_keys(endpoints["known_hosts"])
        self.ssh.set_missing_host_key_policy(paramiko.RejectPolicy())
        self.ssh.connect(host, int(port), "admin", key_filename=endpoints["key_file"], allow_agent=False,
                         look_for_keys=False, timeout=5)  # fmt: skip
        self.channel = self.ssh.get_transport().open_session()
        self.channel.settimeout(0.05)
        self.buf = b""

    def subsystem(self, name: str = "netconf") -> None:
        self.channel.invoke_subsystem(name)
        self.read_until(EOM)  # the server's hello

    def read_until(self, marker: bytes, timeout: float = 30.0) -> bytes:
        deadline = time.monotonic() + timeout
        while marker not in self.buf:
            if time.monotonic() > deadline:
                raise AssertionError(f"no {marker!r} within {timeout} s; got {self.buf[-300:]!r}")
            try:
                data = self.channel.recv(65536)
            except TimeoutError:
                continue
            if not data:
                raise EOFError(self.buf)
            self.buf += data
        found, _, self.buf = self.buf.partition(marker)
        return found + marker

    def closed_within(self, timeout: float) -> bool:
        """Whether the server closes the channel; `timeout` is a hang guard (it returns as soon as it closes)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                data = self.channel.recv(65536)
            except TimeoutError:
                continue
            if not data:
                return True
            self.buf += data
        return False

    def close(self) -> None:
        self.ssh.close()


@pytest.fixture
def raw(local_switch):
    clients: list[RawClient] = []

    def open_client(**options) -> tuple[RawClient, object]:
        switch = local_switch(**options)
        clients.append(RawClient(switch.endpoints))
        return clients[-1], switch

    yield open_client
    for c in clients:
        c.close()


def chunk(xml: str) -> bytes:
    return frame(xml.encode(), chunked=True)


def test_a_chunk_that_never_ends_closes_the_session_in_time(raw):
    client, switch = raw(message_timeout_s=0.4)
    client.subsystem()
    client.channel.sendall(HELLO_11 + b"\n#100\n<rpc")
    start = time.monotonic()
    error = client.read_until(b"\n##\n", timeout=30)  # a hang guard: returns as soon as the error comes
    assert b"<error-tag>malformed-message</error-tag>" in error and b"never ended" in error
    assert client.closed_within(30)
    # A lower bound of the model: the session cannot be closed before its 0.4 s message timeout, however busy the
    # machine. How soon after it is closed is no behaviour; that it was closed for the chunk is asserted below.
    assert time.monotonic() - start > 0.3
    assert "never ended" in switch.frontend.sessions[-1]["end"]


def test_a_bad_chunk_header_gets_an_error_then_the_session_closes(raw):
    client, _ = raw()
    client.subsystem()
    client.channel.sendall(HELLO_11 + b"\n#abc\n")
    assert b"<error-tag>malformed-message</error-tag>" in client.read_until(b"\n##\n")
    assert client.closed_within(30)


def test_an_oversized_message_is_too_big(raw):
    client, _ = raw(max_message=4096)
    client.subsystem()
    client.channel.sendall(f'<hello xmlns="{NC}"><capabilities><capability>urn:ietf:params:netconf:base:1.0'
                           "</capability></capabilities></hello>]]>]]>".encode())  # fmt: skip
    client.channel.sendall(b"<rpc>" + b" " * 10_000)
    reply = client.read_until(EOM)
    assert b"<error-tag>too-big</error-tag>" in reply
    assert client.closed_within(30)


def test_no_hello_in_time_closes_the_session(raw):
    client, switch = raw(hello_timeout_s=0.3)
    client.subsystem()
    assert client.closed_within(30)
    assert "no hello" in switch.frontend.sessions[-1]["end"]


def test_billion_laughs_over_ssh_is_an_error_and_the_session_goes_on(raw):
    client, _ = raw()
    client.subsystem()
    client.channel.sendall(HELLO_11 + frame(BILLION_LAUGHS, chunked=True))
    assert b"<error-tag>malformed-message</error-tag>" in client.read_until(b"\n##\n")
    client.channel.sendall(chunk(f'<rpc xmlns="{NC}" message-id="2"><get><filter/></get></rpc>'))
    assert b'message-id="2"><data></data>' in client.read_until(b"\n##\n")


def test_other_subsystems_and_exec_are_refused(raw):
    client, _ = raw()
    with pytest.raises(paramiko.SSHException):
        client.channel.invoke_subsystem("sftp")
    channel = client.ssh.get_transport().open_session()
    with pytest.raises(paramiko.SSHException):
        channel.exec_command("id")
