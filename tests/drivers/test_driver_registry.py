"""Driver names in inventories -> driver objects, built-ins and `testbed.drivers` entry points."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

import testbed.contracts.registry as registry_module
import testbed.families.drivers as drivers_module
from drivers.errors import DeviceConnectionError
from drivers.scpi.polatis import PolatisScpi
from drivers.transports import TransportSettings
from drivers.transports.serial import SerialTransport
from drivers.transports.visa import VisaTransport
from testbed.families.drivers import BUILTIN_DRIVERS, DRIVERS, ENTRY_POINT_GROUP, driver_registry, make_driver


def test_polatis_over_visa_and_serial(closed_port):
    visa = make_driver("polatis-scpi", "ocs1", TransportSettings("visa", f"TCPIP0::127.0.0.1::{closed_port}::SOCKET"))
    assert isinstance(visa, PolatisScpi)
    assert isinstance(visa.transport, VisaTransport)
    serial = make_driver("polatis-scpi", "ocs2", TransportSettings("serial", "/dev/does-not-exist"))
    assert isinstance(serial.transport, SerialTransport)
    # Building a driver touches nothing; the first call does, and says where it failed.
    with pytest.raises(DeviceConnectionError, match="ocs2"):
        serial.identify()


def test_audit_sink_reaches_the_transport(server_factory, audit_log):
    server = server_factory(reply=lambda req: "Polatis,N-OST-16x16,1,6.5" if req == "*IDN?" else None)
    drv = make_driver("polatis-scpi", "ocs1", TransportSettings("serial", server.url, timeout_s=0.5), audit_log.sink)
    assert drv.identify().vendor == "Polatis"
    assert [(r.device, r.direction) for r in audit_log] == [("ocs1", "tx"), ("ocs1", "rx")]
    drv.close()


def test_unknown_driver_lists_the_known_ones():
    assert "polatis-scpi" in DRIVERS
    with pytest.raises(ValueError) as info:
        make_driver("acme-tl1", "ocs1", TransportSettings("visa", "TCPIP0::h::5025::SOCKET"))
    text = str(info.value)
    assert "acme-tl1" in text and "polatis-scpi" in text and "polatis-tl1" in text and ENTRY_POINT_GROUP in text


def test_third_party_driver_from_an_entry_point(monkeypatch):
    made = {}

    def fake_entry_points(group):
        assert group == ENTRY_POINT_GROUP
        return [
            EntryPoint("lab-switch", "testbed.families.drivers:_polatis_scpi", group),
            EntryPoint("polatis-scpi", "nonexistent.module:shadow", group),  # may not replace a built-in
        ]

    monkeypatch.setattr(registry_module, "entry_points", fake_entry_points)
    monkeypatch.setattr(drivers_module, "_polatis_scpi", lambda *a: made.setdefault("args", a))
    registry = driver_registry()
    assert set(registry.names()) == {"lab-switch", *(d.name for d in BUILTIN_DRIVERS)}
    settings = TransportSettings("visa", "TCPIP0::h::5025::SOCKET")
    spec = registry.get("lab-switch")
    assert (spec.family, spec.transports) == (None, None)  # a bare factory: any family, any transport
    spec.factory("ocs9", settings, None)
    assert made["args"] == ("ocs9", settings, None)
    assert registry.get("polatis-scpi") is next(d for d in BUILTIN_DRIVERS if d.name == "polatis-scpi")


def test_drivers_share_the_registry_type_of_every_seam():
    assert isinstance(DRIVERS, registry_module.Registry)
