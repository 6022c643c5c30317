"""Each TL1 front end driven by hand over a plain socket: hand-written commands, no project code on the client
side, the bytes checked as a telnet user or a third-party script would see them.
"""

from __future__ import annotations

import re
import time

import pytest
from tl1_harness import CALIENT, POLATIS, SIZE, Raw

from emulators.frontends import TWIN_PASSWORD


@pytest.fixture
def raw(tl1_twin):
    opened = []

    def connect(device: str, *, login: bool = True) -> Raw:
        tl1_twin.control.call(device, "reset")
        client = Raw(tl1_twin.endpoints.devices[device]["tl1"])
        opened.append(client)
        if login:
            client.send(f"ACT-USER::admin:1::{TWIN_PASSWORD};\r\n")
            assert b"M  1 COMPLD" in client.response("1")
        return client

    yield connect
    for client in opened:
        client.close()


def lines(block: bytes) -> list[str]:
    return [line.strip() for line in block.decode().split("\r\n") if line.strip()]


@pytest.mark.parametrize("device", [POLATIS, CALIENT])
def test_login_is_required_and_checked(raw, device):
    c = raw(device, login=False)
    c.send("RTRV-HDR:::7:;")
    block = c.response("7")
    assert lines(block)[1:] == ["M  7 DENY", "PLNA", "/* log in first with ACT-USER */", ";"]
    assert re.match(rb"\r\n\n   " + device.encode() + rb" \d\d-\d\d-\d\d \d\d:\d\d:\d\d\r\n", block)
    c.send("ACT-USER::admin:8::wrong;")
    assert lines(c.response("8"))[1:3] == ["M  8 DENY", "PIUI"]
    c.send("ACT-USER::root:9::" + TWIN_PASSWORD + ";")
    assert lines(c.response("9"))[2] == "PIUI"  # the same answer for a wrong user: nothing to guess from
    c.send("act-user::admin:10::" + TWIN_PASSWORD + ";")  # verbs in any case
    assert lines(c.response("10"))[1:] == ["M  10 COMPLD", ";"]
    c.send("CANC-USER::admin:11:;RTRV-HDR:::12:;")  # two commands in one write
    assert b"COMPLD" in c.response("11") and b"PLNA" in c.response("12")


def test_polatis_session(raw):
    c = raw(POLATIS)
    c.send("ENT-PATCH::1&2,17&18:2:;\r\n")
    assert lines(c.response("2"))[1:] == ["M  2 COMPLD", ";"]
    c.send("ENT-PATCH::19,3:3:;\r\n")  # egress first is accepted
    c.response("3")
    c.send("RTRV-PATCH:::4:;\r\n")
    assert lines(c.response("4"))[2:] == ['"1,17"', '"2,18"', '"3,19"', ";"]
    c.send("RTRV-PATCH::2&19:5:;")
    assert lines(c.response("5"))[2:] == ['"2,18"', '"3,19"', ";"]
    c.send("ENT-PATCH::4,17:6:;")  # egress 17 is patched already
    assert lines(c.response("6"))[1:4] == ["M  6 DENY", "SNVS", "/* egress 17 is patched to ingress 1 */"]
    c.send("ENT-PATCH::1,99:7:;")
    assert lines(c.response("7"))[2:4] == ["IIAC", f"/* port 99 is not in 1..{2 * SIZE} */"]
    c.send("DLT-PATCH::17:8:;")  # by either port
    c.response("8")
    c.send("OPR-PORT-SHUTTER::2&&3:9:;RTRV-PORT-SHUTTER::1&&4:10:;")
    c.response("9")
    assert lines(c.response("10"))[2:] == ['"1:OPEN"', '"2:CLOSED"', '"3:CLOSED"', '"4:OPEN"', ";"]
    c.send("RLS-PORT-SHUTTER::2&3:11:;RTRV-PORT-POWER::3&19:12:;")
    c.response("11")
    assert lines(c.response("12"))[2:] == ['"3:0.00"', '"19:-1.00"', ";"]
    c.send("RTRV-EQPT::SYSTEM:13:::PARAMETER=SIZE;RTRV-NETYPE:::14:;RTRV-INV::OCS:15:;")
    assert lines(c.response("13"))[2] == f'"SYSTEM:SIZE={SIZE}x{SIZE}"'
    assert lines(c.response("14"))[2] == '"Polatis,N-OST-32x32-LU1-DMHNS,OCS,6.5.2.18"'
    assert "SN=000001" in lines(c.response("15"))[2]
    c.send(f'RTRV-PATCH:"{POLATIS}"::16:;RTRV-PATCH:other::17:;')  # the TID: this switch's name, or none
    assert b"COMPLD" in c.response("16") and b"IITA" in c.response("17")
    c.send("DLT-PATCH::ALL:18:;RTRV-PATCH:::19:;")
    c.response("18")
    assert lines(c.response("19"))[1:] == ["M  19 COMPLD", ";"]


def test_calient_session(raw):
    c = raw(CALIENT)
    assert c.buf.startswith(b"agent>") or b"agent>" in c.read_until(rb"agent>")  # the prompt
    c.send("ENT-CRS::1.1.1,1.1.3:2::Quali,1WAY;\r\n")  # Quali's two steps
    assert lines(c.response("2"))[1:] == ["M  2 COMPLD", ";"]
    c.send("RTRV-CRS:::::ALL;")  # Quali's form: no CTAG, answered as CTAG 0
    (crs,) = lines(c.response("0"))[2:-1]
    assert crs.startswith('"1.1.1>1.1.3:SRCPORT=1.1.1,DSTPORT=1.1.3,GRPNAME=Quali,CONNNAME=1.1.1>1.1.3,CONNTYPE=1WAY')
    assert ",OS=PND," in crs  # entered, not active
    c.send("ACT-CRS::1.1.1,1.1.3:3::1.1.1>1.1.3,Quali;")
    c.response("3")
    c.send("RTRV-PORT-SUM::1.1.1:4;")
    (summary,) = lines(c.response("4"))[2:-1]
    assert summary == '"1.1.1:ALIAS=NONE,INPWR=-99.99,OUTPWR=-99.99,CONNNAME1=1.1.1>1.1.3,CONNSTATE1=ACT,' + (
        'CONNNAME2=NONE,CONNSTATE2=NONE"'
    )
    c.send("RTRV-PORT-SUM::1.1.3:5;")  # port 3 has light arriving; its output is port 1's
    assert "INPWR=0.00,OUTPWR=-99.99" in lines(c.response("5"))[2]
    c.send("DLT-CRS::1.1.1,1.1.3:6::,Quali,1.1.1>1.1.3;")  # active: deactivate first
    assert lines(c.response("6"))[2] == "SNVS"
    c.send("CANC-CRS::1.1.1,1.1.3:7::,Quali,1.1.1>1.1.3;DLT-CRS::1.1.1,1.1.3:8::,Quali,1.1.1>1.1.3;")
    assert b"COMPLD" in c.response("7") and b"COMPLD" in c.response("8")
    c.send("RTRV-CRS:::9::ALL;ENT-CRS::1.1.1,9.9.9:10::g,1WAY;ENT-CRS::1.1.1,1.1.2:11::g,2WAY;")
    assert lines(c.response("9"))[1:] == ["M  9 COMPLD", ";"]
    assert lines(c.response("10"))[2] == "IIAC" and lines(c.response("11"))[2] == "INUP"
    c.send("ED-PORT::1.1.2:12:::INAS=OOS;RTRV-PORT::1.1.2:13;")
    c.response("12")
    assert lines(c.response("13"))[2] == (
        '"1.1.2:WX,NONE,NONE:INAS=OOS,INOS=OOS,INOC=OK,INRS=NPR,OUTAS=IS,OUTOS=IS,OUTOC=OK,OUTRS=NPR"'
    )
    c.send("RTRV-NE;")
    assert "CHASSISTYPE=S320" in lines(c.response("0"))[2]
    assert c.read_until(rb"agent>") == b"\r\nagent>"  # after every response


@pytest.mark.parametrize("device", [POLATIS, CALIENT])
def test_a_command_without_its_semicolon_is_denied_not_left_hanging(raw, device):
    c = raw(device)
    c.send("RTRV-HDR:::5:\r\nRTRV-HDR:::6:;\r\n")
    assert lines(c.response("5"))[1:3] == ["M  5 DENY", "IISP"]
    assert b"COMPLD" in c.response("6")
    c.send(b"RTRV-HDR:::7\xff:;RTRV-HDR:::toolong7:;RTRV-HDR:::8:;")
    assert lines(c.response("0"))[2] == "IISP"  # not ASCII: the CTAG cannot be trusted either
    assert lines(c.response("0"))[2] == "IICT"
    assert b"COMPLD" in c.response("8")


@pytest.mark.parametrize("device", [POLATIS, CALIENT])
def test_alarms_reach_logged_in_sessions_unless_inhibited(raw, tl1_twin, device):
    quiet, loud, anonymous = raw(device), raw(device), raw(device, login=False)
    quiet.send("INH-MSG-ALL:::2:;")
    quiet.response("2")
    tl1_twin.control.call(device, "fail_port", port=SIZE + 2)
    alarm = loud.read_until(rb"REPT ALM\r\n.*?;")
    aid = "18" if device == POLATIS else "1.1.2"
    assert re.search(rb"\*\* +\d+ REPT ALM\r\n   \"" + aid.encode() + rb":MJ,FAIL,SA,[\d-]+,[\d-]+,,TRMT:", alarm)
    loud.send("RTRV-ALM-ALL:::3:;")
    assert lines(loud.response("3"))[2].startswith(f'"{aid}:MJ,FAIL,SA,')
    time.sleep(0.1)  # several polls: nothing for the others
    for client in (quiet, anonymous):
        client.send("RTRV-HDR:::4:;")
        before = client.read_until(rb"M  4 \w+\r\n.*?;")
        assert b"REPT" not in before
    tl1_twin.control.call(device, "restore_port", port=SIZE + 2)
    assert re.search(rb"A  +\d+ REPT ALM\r\n   \"" + aid.encode() + rb":CL,", loud.read_until(rb"REPT ALM\r\n.*?;"))
