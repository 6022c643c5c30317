"""Checking NETCONF messages against the optical-switch YANG subset with libyang's yanglint (Debian libyang2-tools).

What a message carries that the model defines, and how yanglint is told what it is (`-t`):
- edit-config: the children of <config>, as edit content (`edit`: no mandatory-node or state checks; the
  nc:operation attribute is read through tests/netconf/yang/testbed-netconf-operation.yang);
- get / get-config: the children of the reply's <data> (`get`, `getconfig`: state data is allowed only in a get's);
- port-set-state: the RPC element itself, as the input of the model's RPC (`rpc`);
- lock, unlock, close-session: NETCONF's own operations, with nothing of the model in them: only their target is
  checked (running), here in Python.
"""

from __future__ import annotations

import subprocess
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

NC = "urn:ietf:params:xml:ns:netconf:base:1.0"
OPSW = "http://www.polatis.com/yang/optical-switch"
YANG = Path(__file__).parent / "yang"
MODULES = [YANG / "optical-switch.yang", YANG / "testbed-switch-motion.yang", YANG / "testbed-netconf-operation.yang"]
BASE_OPERATIONS = {"lock", "unlock", "close-session"}


@dataclass(frozen=True)
class Document:
    """One thing to validate: what it is (`kind`, yanglint's -t), where it came from, and the XML."""

    kind: str
    origin: str
    xml: str


def _local(tag: str) -> tuple[str | None, str]:
    if tag.startswith("{"):
        ns, _, name = tag[1:].partition("}")
        return ns, name
    return None, tag


def _children(elem: ET.Element | None) -> str:
    return "".join(ET.tostring(c, encoding="unicode") for c in ([] if elem is None else elem))


def documents(rpc: str, reply: str | None) -> tuple[str, list[Document]]:
    """The operation's name and what of this exchange the model defines (see the module docstring)."""
    root = ET.fromstring(rpc)
    (op,) = list(root)
    ns, name = _local(op.tag)
    origin = f"{name}: {rpc}"
    found: list[Document] = []
    if ns == NC and name == "edit-config":
        config = next(c for c in op if c.tag in (f"{{{NC}}}config", "config"))
        found.append(Document("edit", origin, _children(config)))
    elif ns == NC and name in ("get", "get-config"):
        answer = ET.fromstring(reply) if reply else None
        data = answer if answer is not None and answer.tag == f"{{{NC}}}data" else None  # a handler's own answer
        if answer is not None and data is None:
            data = answer.find(f"{{{NC}}}data")  # within the <rpc-reply>
        if data is not None:  # a refusal carries no data
            found.append(Document("get" if name == "get" else "getconfig", f"reply to {origin}", _children(data)))
    elif ns == OPSW:
        found.append(Document("rpc", origin, ET.tostring(op, encoding="unicode")))
    elif ns == NC and name in BASE_OPERATIONS:
        if name != "close-session":
            targets = [c.tag for c in op.iterfind(f"{{{NC}}}target/*")]
            assert targets == [f"{{{NC}}}running"], f"{name} of {targets}, not of running: {rpc}"
    else:
        raise AssertionError(f"an operation the validation does not know: {rpc}")
    return name, found


def yanglint(program: str, doc: Document, modules: list[Path] = MODULES) -> str | None:
    """None if the document is valid; else what yanglint said, with the document."""
    if not doc.xml:
        return None  # nothing selected (an empty <data/>): nothing to check
    with tempfile.NamedTemporaryFile("w", suffix=".xml", encoding="utf-8") as f:
        f.write(doc.xml)
        f.flush()
        done = subprocess.run(
            [program, "-t", doc.kind, *map(str, modules), f.name], capture_output=True, text=True, timeout=60
        )
    if done.returncode == 0 and "err" not in done.stderr.lower():
        return None
    said = done.stderr.strip()
    return f"yanglint -t {doc.kind} (exit {done.returncode}): {said}\n  document: {doc.xml}\n  from {doc.origin}"
