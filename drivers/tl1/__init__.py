"""TL1 drivers for optical circuit switches (docs/protocols.md §8): `polatis-tl1` and `calient-tl1`.

The factories and audit models testbed/families/drivers.py names. Nothing is connected when a driver is made: the
transport connects and logs in on the first command.
"""

from __future__ import annotations

from drivers.audit import AuditSink
from drivers.transports.tl1_settings import Tl1Settings


def make_polatis_tl1(device: str, settings: Tl1Settings, audit: AuditSink | None = None):
    from drivers.tl1.polatis import PolatisTl1
    from drivers.transports.tl1 import Tl1Transport

    return PolatisTl1(Tl1Transport(settings, device, audit), device)


def make_calient_tl1(device: str, settings: Tl1Settings, audit: AuditSink | None = None):
    from drivers.tl1.calient import CalientTl1
    from drivers.transports.tl1 import Tl1Transport

    return CalientTl1(Tl1Transport(settings, device, audit), device)


def polatis_tl1_audit(size: int):
    from drivers.tl1.audit import PolatisTl1AuditModel

    return PolatisTl1AuditModel(size)


def calient_tl1_audit(size: int):
    from drivers.tl1.audit import CalientTl1AuditModel

    return CalientTl1AuditModel(size)
