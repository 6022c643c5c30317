"""PolatisScpi grammar against a scripted fake of the device's replies (no sockets, no emulator)."""

from __future__ import annotations

import pytest

from drivers.capabilities import CircuitSwitch, Identity
from drivers.errors import DeviceCommandError, DeviceConnectionError, DeviceProtocolError, DeviceTimeout
from drivers.scpi.polatis import PolatisScpi


class FakeSwitch:
    """A MessageTransport that answers from a table and records the conversation.

    `replies` maps a query to its answer (an exception is raised), or to a list of answers given in turn.
    """

    address = "fake://polatis"

    def __init__(self, replies: dict[str, str | list[str]] | None = None) -> None:
        self.replies = {":SYST:ERR?": '0,"No error"', ":OXC:SWIT:SIZE?": "16,16", **(replies or {})}
        self.log: list[tuple[str, str]] = []
        self.closed = False

    def write(self, message: str) -> None:
        self.log.append(("write", message))

    def query(self, message: str) -> str:
        self.log.append(("query", message))
        reply = self.replies[message]
        if isinstance(reply, list):
            reply = reply.pop(0) if len(reply) > 1 else reply[0]
        if isinstance(reply, Exception):
            raise reply
        return reply

    def close(self) -> None:
        self.closed = True

    @property
    def writes(self) -> list[str]:
        return [m for kind, m in self.log if kind == "write"]


def switch(replies=None, **kwargs) -> tuple[PolatisScpi, FakeSwitch]:
    fake = FakeSwitch(replies)
    return PolatisScpi(fake, "ocs1", **kwargs), fake


def test_is_a_circuit_switch():
    drv, _ = switch()
    assert isinstance(drv, CircuitSwitch)


# -- *IDN? and size ----------------------------------------------------------------------------


def test_identify():
    drv, _ = switch({"*IDN?": "Polatis,N-OST-32x32-LU1-DMHNS,000001,6.5.2.18"})
    assert drv.identify() == Identity("Polatis", "N-OST-32x32-LU1-DMHNS", "000001", "6.5.2.18")


@pytest.mark.parametrize("reply", ["Polatis,N-OST,000001", "a,b,c,d,e", "", "garbage"])
def test_identify_rejects_other_than_four_fields(reply):
    drv, _ = switch({"*IDN?": reply})
    with pytest.raises(DeviceProtocolError) as info:
        drv.identify()
    assert info.value.sent == "*IDN?"
    assert info.value.received == reply
    assert "ocs1" in str(info.value) and "fake://polatis" in str(info.value)


@pytest.mark.parametrize(("reply", "expected"), [("16,16", (16, 16)), ("32, 32", (32, 32)), ("8,24", (8, 24))])
def test_size(reply, expected):
    drv, _ = switch({":OXC:SWIT:SIZE?": reply})
    assert drv.size() == expected


@pytest.mark.parametrize("reply", ["16", "16,16,16", "a,b", ""])
def test_size_malformed(reply):
    drv, _ = switch({":OXC:SWIT:SIZE?": reply})
    with pytest.raises(DeviceProtocolError, match="SIZE"):
        drv.size()


# -- connections -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("(@1,2),(@17,18)", {1: 17, 2: 18}),
        ("(@),(@)", {}),
        ("(@1, 2),(@17, 18)", {1: 17, 2: 18}),
        (" (@3),(@20) ", {3: 20}),
    ],
)
def test_connections(reply, expected):
    drv, _ = switch({":OXC:SWIT:CONN:STAT?": reply})
    assert drv.connections() == expected


@pytest.mark.parametrize(
    "reply",
    ["(@1,2),(@17)", "(@1,x),(@17,18)", "1,2,17,18", "(@1,2)", "(@1,2);(@17,18)", "", "(@1,,2),(@17,18,19)"],
)
def test_connections_malformed(reply):
    drv, _ = switch({":OXC:SWIT:CONN:STAT?": reply})
    with pytest.raises(DeviceProtocolError) as info:
        drv.connections()
    assert info.value.received == reply
    assert ":OXC:SWIT:CONN:STAT?" in str(info.value)


def test_connect_normalises_pairs_and_checks_errors():
    drv, fake = switch()
    drv.connect([(17, 1), (2, 18)])
    assert fake.log == [("write", ":OXC:SWIT:CONN:ADD (@1,2),(@17,18)"), ("query", ":SYST:ERR?")]


def test_disconnect_and_disconnect_all():
    drv, fake = switch()
    drv.disconnect([(18, 2)])
    drv.disconnect_all()
    assert fake.writes == [":OXC:SWIT:CONN:SUB (@2),(@18)", ":OXC:SWIT:DISC:ALL"]


def test_empty_pair_lists_do_no_io():
    drv, fake = switch()
    drv.connect([])
    drv.disconnect(iter(()))
    drv.set_port_enabled([], True)
    assert drv.port_power([]) == {}
    assert drv.port_states([]) == {}
    assert fake.log == []


def test_ports_must_be_integers_before_anything_is_sent():
    drv, fake = switch()
    with pytest.raises(TypeError):
        drv.connect([(1.0, 17)])
    with pytest.raises(TypeError):
        drv.port_power(["3"])
    assert fake.log == []


@pytest.mark.parametrize(("reply", "ok"), [("1", True), (" 1", True), ("0", False), ("", False)])
def test_wait_settled(reply, ok):
    drv, fake = switch({"*OPC?": reply})
    if ok:
        drv.wait_settled()
    else:
        with pytest.raises(DeviceProtocolError, match=r"\*OPC\?"):
            drv.wait_settled()
    assert fake.log == [("query", "*OPC?")]


# -- port power and state ----------------------------------------------------------------------


@pytest.mark.parametrize("reply", ["(-3.5,-99.99)", "-3.5,-99.99", " -3.5 , -99.99 ", "(-3.5E0,-9.999E1)"])
def test_port_power(reply):
    drv, fake = switch({":PMON:POW? (@17,18)": reply})
    assert drv.port_power([17, 18]) == {17: -3.5, 18: -99.99}


@pytest.mark.parametrize("reply", ["-3.5", "-3.5,-99.99,1.0", "-3.5,abc", "", "()"])
def test_port_power_malformed(reply):
    drv, _ = switch({":PMON:POW? (@17,18)": reply})
    with pytest.raises(DeviceProtocolError) as info:
        drv.port_power([17, 18])
    assert info.value.sent == ":PMON:POW? (@17,18)"


def test_port_power_is_chunked_at_256_ports():
    ports = list(range(1, 601))

    class Answering(FakeSwitch):
        def query(self, message):
            self.log.append(("query", message))
            inner = message.split("(@", 1)[1].rstrip(")")
            return ",".join(f"-{p}.5" for p in inner.split(","))

    fake = Answering()
    power = PolatisScpi(fake, "ocs1").port_power(ports)
    assert power == {p: -(p + 0.5) for p in ports}
    sizes = [len(m.split("(@", 1)[1].split(",")) for _, m in fake.log]
    assert sizes == [256, 256, 88]


def test_set_port_enabled():
    drv, fake = switch()
    drv.set_port_enabled([3, 4], False)
    drv.set_port_enabled([3], True)
    assert fake.writes == [":OXC:SWIT:PORT:DIS (@3,4)", ":OXC:SWIT:PORT:ENAB (@3)"]


@pytest.mark.parametrize("reply", ["(E,D,F)", "E,D,F", "(e, d, f)"])
def test_port_states(reply):
    drv, _ = switch({":OXC:SWIT:PORT:STAT? (@1,2,3)": reply})
    assert drv.port_states([1, 2, 3]) == {1: "E", 2: "D", 3: "F"}


@pytest.mark.parametrize("reply", ["(E,D)", "(E,D,X)", "", "(E,D,F,E)"])
def test_port_states_malformed(reply):
    drv, _ = switch({":OXC:SWIT:PORT:STAT? (@1,2,3)": reply})
    with pytest.raises(DeviceProtocolError, match="E, D or F"):
        drv.port_states([1, 2, 3])


# -- the error queue ---------------------------------------------------------------------------


def test_refused_command_names_the_command_and_the_device_error():
    drv, fake = switch({":SYST:ERR?": ['-222,"Data out of range"', '0,"No error"']})
    with pytest.raises(DeviceCommandError) as info:
        drv.connect([(1, 99)])
    err = info.value
    assert err.sent == ":OXC:SWIT:CONN:ADD (@1),(@99)"
    assert '-222,"Data out of range"' in str(err)
    assert ":OXC:SWIT:CONN:ADD (@1),(@99)" in str(err)
    assert "ingress 1..16 and egress 17..32" in err.hint  # from :OXC:SWIT:SIZE?
    # The queue was drained to "0" so the next command does not inherit this error.
    assert [m for k, m in fake.log if k == "query"] == [":SYST:ERR?", ":SYST:ERR?", ":OXC:SWIT:SIZE?"]


def test_all_queued_errors_are_reported():
    drv, _ = switch({":SYST:ERR?": ['-113,"Undefined header"', '+1,"Device specific"', '+0,"No error"']})
    with pytest.raises(DeviceCommandError) as info:
        drv.disconnect_all()
    assert info.value.received == '-113,"Undefined header"; +1,"Device specific"'
    assert "firmware" in info.value.hint


def test_error_queue_drain_is_bounded():
    drv, fake = switch({":SYST:ERR?": '-350,"Queue overflow"'})
    with pytest.raises(DeviceCommandError, match="Queue overflow") as info:
        drv.disconnect_all()
    assert len([m for k, m in fake.log if m == ":SYST:ERR?"]) == 32
    assert "not empty after 32 reads" in info.value.received


def test_malformed_error_reply():
    drv, _ = switch({":SYST:ERR?": "what?"})
    with pytest.raises(DeviceProtocolError, match="SYST:ERR"):
        drv.disconnect_all()


def test_error_checking_can_be_turned_off():
    drv, fake = switch({":SYST:ERR?": '-222,"Data out of range"'}, check_errors=False)
    drv.connect([(1, 99)])
    assert fake.log == [("write", ":OXC:SWIT:CONN:ADD (@1),(@99)")]


def test_close_closes_the_transport():
    drv, fake = switch()
    with drv:
        pass
    assert fake.closed


def no_reply(cmd: str) -> DeviceTimeout:
    return DeviceTimeout("no complete reply", device="ocs1", address="fake://polatis", sent=cmd)


def test_rejected_port_query_is_reported_from_the_error_queue():
    # SCPI answers nothing to a query it rejects; the error queue says why.
    cmd = ":PMON:POW? (@99)"
    drv, _ = switch(
        {cmd: no_reply(cmd), ":SYST:ERR?": ['-222,"Data out of range;port 99 not in 1..32"', '0,"No error"']}
    )
    with pytest.raises(DeviceCommandError) as info:
        drv.port_power([99])
    assert info.value.sent == cmd
    assert "port 99 not in 1..32" in str(info.value)
    assert isinstance(info.value.__cause__, DeviceTimeout)


def test_port_query_timeout_with_an_empty_queue_stays_a_timeout():
    cmd = ":OXC:SWIT:PORT:STAT? (@1)"
    drv, _ = switch({cmd: no_reply(cmd)})
    with pytest.raises(DeviceTimeout):
        drv.port_states([1])


def test_port_query_timeout_on_a_dead_switch_stays_a_timeout():
    cmd = ":PMON:POW? (@1)"
    lost = DeviceConnectionError("connection lost", device="ocs1", address="fake://polatis")
    drv, _ = switch({cmd: no_reply(cmd), ":SYST:ERR?": lost})
    with pytest.raises(DeviceTimeout) as info:
        drv.port_power([1])
    assert info.value.sent == cmd


def test_argument_free_query_timeout_does_not_touch_the_error_queue():
    drv, fake = switch({"*OPC?": no_reply("*OPC?")})
    with pytest.raises(DeviceTimeout):
        drv.wait_settled()
    assert fake.log == [("query", "*OPC?")]
