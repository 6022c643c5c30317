"""XML for the NETCONF server: parsing what a client sends (defusedxml: no DTD, no entity), writing replies with a
default namespace per element as Polatis and ONOS write them, and subtree filtering (RFC 6241 §6).
"""

from __future__ import annotations

import copy
import re
import xml.etree.ElementTree as ET

import defusedxml.ElementTree as SafeET
from defusedxml import DefusedXmlException

from emulators.netconf.protocol import NC_NS, XML_NS, RpcError

UINT = re.compile(r"[0-9]{1,10}")
_XML_DECL = re.compile(rb"\A<\?xml[^>]*?encoding\s*=\s*['\"]([A-Za-z0-9._-]+)['\"]")


def split(tag: str) -> tuple[str | None, str]:
    """An ElementTree name as (namespace or None, local name)."""
    if tag.startswith("{"):
        ns, _, local = tag[1:].partition("}")
        return ns, local
    return None, tag


def parse_xml(message: bytes) -> ET.Element:
    """UTF-8 XML without DTD or entities; anything else is malformed-message (RFC 6241 Appendix A)."""
    try:
        message.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RpcError("malformed-message", f"the message is not UTF-8: {exc}") from None
    decl = _XML_DECL.match(message)
    if decl and decl.group(1).lower().replace(b"_", b"-") not in (b"utf-8", b"utf8"):
        raise RpcError("malformed-message", f"encoding {decl.group(1).decode()} is not UTF-8")
    try:
        return SafeET.fromstring(message, forbid_dtd=True)
    except DefusedXmlException as exc:
        raise RpcError("malformed-message", f"DTDs and entities are refused: {type(exc).__name__}") from None
    except ET.ParseError as exc:
        raise RpcError("malformed-message", f"not well-formed XML: {exc}") from None
    except (ValueError, RecursionError) as exc:  # expat oddities: the message is unusable either way
        raise RpcError("malformed-message", f"unreadable XML: {type(exc).__name__}") from None


def escape(text: str, attr: bool = False) -> str:
    """`text` escaped for XML character data (attr=True: for an attribute value in double quotes)."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    if attr:
        text = text.replace('"', "&quot;").replace("\n", "&#10;").replace("\r", "&#13;").replace("\t", "&#9;")
    return text.replace("\r", "&#13;")


def to_xml(elem: ET.Element, parent_ns: str | None = None) -> str:
    """Serialise with a default namespace per element (xmlns="..." where it changes), as Polatis and ONOS write
    it, not ElementTree's ns0: prefixes. Only unqualified attributes and xml:lang are kept.
    """
    ns, local = split(elem.tag)
    parts = [f"<{local}"]
    if ns != parent_ns:
        parts.append(f' xmlns="{escape(ns or "", True)}"')
    for key, value in elem.attrib.items():
        kns, kname = split(key)
        if kns is None:
            parts.append(f' {kname}="{escape(value, True)}"')
        elif kns == XML_NS:
            parts.append(f' xml:{kname}="{escape(value, True)}"')
    children = list(elem)
    if not children and not elem.text:
        parts.append("/>")
        return "".join(parts)
    parts.append(">")
    if elem.text:
        parts.append(escape(elem.text))
    for child in children:
        parts.append(to_xml(child, ns))
        if child.tail:
            parts.append(escape(child.tail))
    parts.append(f"</{local}>")
    return "".join(parts)


def add_leaf(parent: ET.Element, ns: str, name: str, text: object) -> ET.Element:
    """A new child leaf `name` of `parent`, in namespace `ns`, holding `text`."""
    el = ET.SubElement(parent, f"{{{ns}}}{name}")
    el.text = str(text)
    return el


def text_of(elem: ET.Element) -> str:
    """An element's text, stripped."""
    return (elem.text or "").strip()


# -- subtree filtering (RFC 6241 §6) ----------------------------------------------------------------


def name_match(f: ET.Element, d: ET.Element) -> bool:
    """Whether the filter node `f` names the data node `d` (RFC 6241 §6.2.5)."""
    fns, flocal = split(f.tag)
    dns, dlocal = split(d.tag)
    # A filter node without a namespace matches any; so does one in the NETCONF namespace, which is where a
    # client's un-namespaced filter lands when it is pasted into the default-namespaced <rpc>.
    return flocal == dlocal and (fns in (None, NC_NS) or fns == dns)


def _is_content(f: ET.Element) -> bool:
    return len(f) == 0 and bool(text_of(f))


def select(data: ET.Element, fnodes: list[ET.Element]) -> list[ET.Element] | None:
    """The children of `data` that the sibling filter nodes `fnodes` select; None if a content match fails
    (then `data` itself is not selected).
    """
    content = [f for f in fnodes if _is_content(f)]
    for f in content:
        if not any(name_match(f, d) and text_of(d) == text_of(f) for d in data):
            return None
    if len(content) == len(fnodes):  # content matches only: the whole instance
        return [copy.deepcopy(d) for d in data]
    out: list[ET.Element] = []
    for d in data:
        matching = [f for f in fnodes if name_match(f, d)]
        if not matching:
            continue
        if any((len(f) == 0 and not text_of(f)) or (_is_content(f) and text_of(f) == text_of(d)) for f in matching):
            out.append(copy.deepcopy(d))  # a selection node, or a content match node that matched
            continue
        kids: list[ET.Element] = []
        seen: set[tuple[str, str]] = set()
        for f in matching:
            if len(f):
                for k in select(d, list(f)) or []:
                    key = (k.tag, text_of(k)) if len(k) == 0 else (k.tag, str(id(k)))
                    if key not in seen:
                        seen.add(key)
                        kids.append(k)
        if kids:
            shell = ET.Element(d.tag, d.attrib)
            shell.extend(kids)
            out.append(shell)
    return out


def wanted_ports(fnodes: list[ET.Element]) -> set[int] | None:
    """Ports a filter on a port list names by port-id content match, or None (all ports): a 512-port switch
    should not read 512 power monitors for a query about two.
    """
    wanted: set[int] = set()
    for top in fnodes:
        entries = list(top)
        if not entries:
            return None
        for entry in entries:
            ids = [c for c in entry if split(c.tag)[1] == "port-id" and UINT.fullmatch(text_of(c))]
            if split(entry.tag)[1] != "port" or not ids:
                return None
            wanted.update(int(text_of(c)) for c in ids)
    return wanted
