"""Helpers of the BMC tests: the emulated hosts' endpoints as a lab's settings would give them."""

from __future__ import annotations

from drivers.redfish import RedfishSettings
from drivers.transports.ssh import SshSettings
from emulators.frontends import TWIN_PASSWORD
from emulators.twin import TwinProcess

HOSTS = ("gpu01", "gpu02")


def endpoints(twin: TwinProcess, host: str = "gpu01") -> dict:
    return twin.endpoints.devices[host]


def bmc_settings(ep: dict, **changes) -> RedfishSettings:
    """The BMC as a lab's inventory would give it, pointed at the twin's emulated BMC."""
    base = {
        "address": ep["redfish"],
        "user": ep["redfish_user"],
        "password": TWIN_PASSWORD,
        "password_env": "LAB_BMC_PASSWORD",
        "ca_file": ep["redfish_ca"],
        "timeout_s": 5.0,
        "power_wait_s": 10.0,
    }
    return RedfishSettings(**{**base, **changes})


def ssh_settings(ep: dict) -> SshSettings:
    address, _, port = ep["ssh"].rpartition(":")
    return SshSettings(address, ep["user"], int(port), ep["key_file"], ep["known_hosts"], timeout_s=5.0)
