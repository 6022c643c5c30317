"""<get> and <get-config> on the switch model: the data tree of the containers a filter asks for, built on the
model's thread, filtered and written on the caller's (RFC 6241 §7.1, §7.7, §6).
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from typing import Any

from emulators.netconf.params import check_running, op_params
from emulators.netconf.protocol import MOTION_NS, NC_NS, OPSW_NS, RpcError, Run
from emulators.netconf.switch import Switch
from emulators.netconf.xmltree import add_leaf, name_match, select, to_xml, wanted_ports


class DataReads:
    """The reads of one switch's datastore: cross-connects, port-config, opm-power, product-information, motion."""

    def __init__(self, server: Switch) -> None:
        self.server = server

    def get(self, op: ET.Element, run: Run, *, config_only: bool) -> str:
        """<get> (or <get-config>: config_only) -> the <data> of its reply."""
        params = op_params(op, ("source", "filter") if config_only else ("filter",), unqualified=("filter",))
        if config_only:
            check_running(params, "source")
        filt = params.get("filter")
        fnodes: list[ET.Element] | None = None
        if filt is not None:
            kind = filt.get("type", "subtree")
            if kind != "subtree":
                raise RpcError(
                    "operation-not-supported",
                    f"filter type {kind!r}: only subtree filters (no :xpath)",
                    info={"bad-attribute": "type", "bad-element": "filter"},
                )
            fnodes = list(filt)
        wanted: dict[tuple[str, str], set[int] | None] = {}
        for key in self._tops(config_only):
            picked = [f for f in fnodes if name_match(f, ET.Element(f"{{{key[0]}}}{key[1]}"))] if fnodes else None
            if fnodes is None:
                wanted[key] = None
            elif picked:
                wanted[key] = wanted_ports(picked)
        data = run(lambda: self._build(wanted, config_only))
        chosen = list(data) if fnodes is None else (select(data, fnodes) or [])
        return "<data>" + "".join(to_xml(c, NC_NS) for c in chosen) + "</data>"

    def _tops(self, config_only: bool) -> list[tuple[str, str]]:
        tops = [(OPSW_NS, "cross-connects"), (OPSW_NS, "port-config")]
        if not config_only:
            tops += [(OPSW_NS, "product-information"), (OPSW_NS, "opm-power")]
            if self.server.options.motion:
                tops.append((MOTION_NS, "switch-motion"))
        return tops

    def _build(self, wanted: dict[tuple[str, str], set[int] | None], config_only: bool) -> ET.Element:
        """The data tree of the containers asked for (runs on the model's thread)."""
        engine, now = self.server.engine, self.server.clock()
        data = ET.Element(f"{{{NC_NS}}}data")
        n = engine.size
        for (ns, name), ports in wanted.items():
            top = ET.SubElement(data, f"{{{ns}}}{name}")
            chosen = range(1, 2 * n + 1) if ports is None else sorted(p for p in ports if 1 <= p <= 2 * n)
            if name == "cross-connects":
                for i, e in sorted(engine.circuits().items()):
                    pair = ET.SubElement(top, f"{{{OPSW_NS}}}{self.server.options.list_name}")
                    add_leaf(pair, OPSW_NS, "ingress", i)
                    add_leaf(pair, OPSW_NS, "egress", e)
            elif name == "port-config":
                for p in chosen:
                    port = ET.SubElement(top, f"{{{OPSW_NS}}}port")
                    add_leaf(port, OPSW_NS, "port-id", p)
                    if not config_only:  # status is config false
                        add_leaf(port, OPSW_NS, "status", _STATUS[engine.port_state(p)])
            elif name == "opm-power":
                for p in chosen:
                    port = ET.SubElement(top, f"{{{OPSW_NS}}}port")
                    add_leaf(port, OPSW_NS, "port-id", p)
                    add_leaf(port, OPSW_NS, "power", f"{engine.power_dbm(p, now):.2f}")
            elif name == "product-information":
                for leaf, value in zip(
                    ("manufacturer", "model-name", "serial-number", "software-version"), _product(engine), strict=True
                ):
                    add_leaf(top, OPSW_NS, leaf, value)
            elif name == "switch-motion":
                remaining = max(0.0, engine.operations_complete_at(now) - now)
                add_leaf(top, MOTION_NS, "settle-remaining-us", math.ceil(remaining * 1e6))
                for p in range(1, 2 * n + 1):
                    if engine.is_moving(p, now):
                        add_leaf(top, MOTION_NS, "moving-port", p)
        return data


_STATUS = {"E": "ENABLED", "D": "DISABLED", "F": "FAILED"}
_SIZE_IN_MODEL = re.compile(r"\d+x\d+")


def _product(engine: Any) -> tuple[str, str, str, str]:
    """manufacturer, model-name, serial-number, software-version from the SCPI identity (*IDN?), with the model
    name's NxM made to match the switch's real size: ONOS and the driver read the size from it.
    """
    fields = [f.strip() for f in engine.spec.idn.split(",")] + ["Unknown"] * 4
    vendor, model, serial, firmware = fields[:4]
    size = f"{engine.size}x{engine.size}"
    model = _SIZE_IN_MODEL.sub(size, model, count=1) if _SIZE_IN_MODEL.search(model) else f"{model}-{size}"
    return vendor, model, serial, firmware
