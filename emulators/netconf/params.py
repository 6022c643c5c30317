"""The parameters of one NETCONF operation, read as RFC 6241 §3.1 and §7 have them."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable

from emulators.netconf.protocol import NC_NS, RpcError
from emulators.netconf.xmltree import split, text_of


def op_params(op: ET.Element, allowed: Iterable[str], unqualified: Iterable[str] = ()) -> dict[str, ET.Element]:
    """The operation's parameters by name: each in the NETCONF namespace, known, and at most once.

    `unqualified` names the parameters also taken without a namespace: the ones ncclient passes on as the user
    wrote them (edit-config's <config>, get's and get-config's <filter>; ncclient's validated_element accepts
    both spellings, its examples and most scripts write a bare <config>, and servers take it). Every other
    parameter, and one in any other namespace, stays unknown-namespace as RFC 6241 §3.1 has it.
    """
    found: dict[str, ET.Element] = {}
    allowed = set(allowed)
    for child in op:
        ns, name = split(child.tag)
        if ns is None and name in unqualified:
            ns = NC_NS
        if ns != NC_NS:
            raise RpcError(
                "unknown-namespace",
                f"<{name}> in {ns!r} is no parameter of <{split(op.tag)[1]}>",
                info={"bad-element": name, "bad-namespace": ns or ""},
            )
        if name not in allowed:
            raise RpcError(
                "unknown-element", f"<{split(op.tag)[1]}> has no parameter <{name}>", info={"bad-element": name}
            )
        if name in found:
            raise RpcError("bad-element", f"<{name}> given twice", info={"bad-element": name})
        found[name] = child
    return found


def check_running(params: dict[str, ET.Element], which: str) -> None:
    """Refuse unless the parameter `which` (target, source) names <running>, this switch's only datastore."""
    holder = params.get(which)
    if holder is None:
        raise RpcError("missing-element", f"<{which}> is required", info={"bad-element": which})
    stores = list(holder)
    if len(stores) != 1 or stores[0].tag != f"{{{NC_NS}}}running":
        names = ", ".join(split(s.tag)[1] for s in stores) or "nothing"
        raise RpcError(
            "invalid-value",
            f"<{which}> must name <running> (this switch has no other datastore), got {names}",
            type="protocol",
            info={"bad-element": which},
        )


def choice(params: dict[str, ET.Element], name: str, allowed: tuple[str, ...], default: str) -> str:
    """The value of the parameter `name`, one of `allowed` (invalid-value if not); `default` when it is absent."""
    if name not in params:
        return default
    value = text_of(params[name])
    if value not in allowed:
        raise RpcError(
            "invalid-value",
            f"<{name}> must be one of {', '.join(allowed)}, got {value!r}",
            type="protocol",
            info={"bad-element": name},
        )
    return value
