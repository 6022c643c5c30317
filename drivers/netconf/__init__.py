"""Optical circuit switches over NETCONF (SSH): the Polatis driver (`polatis-netconf`) and its audit model.

The factories are what testbed/families/drivers.py names; they import ncclient only when a NETCONF switch is used.
"""

from __future__ import annotations

from typing import Any

from drivers.audit import AuditSink
from drivers.netconf.settings import NetconfSettings


def make_polatis_netconf(device: str, settings: NetconfSettings, audit: AuditSink | None) -> Any:
    """The `polatis-netconf` driver for one switch; it connects on first use."""
    from drivers.netconf.polatis import PolatisNetconf

    return PolatisNetconf(settings, device, audit)


def polatis_netconf_audit(size: int) -> Any:
    """What the RPCs `polatis-netconf` sends do to a size x size switch's circuits (for `testbed check`)."""
    from drivers.netconf.audit import PolatisNetconfAuditModel

    return PolatisNetconfAuditModel(size)
