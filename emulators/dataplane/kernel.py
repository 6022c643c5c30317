"""KernelPlane: with --netns, the twin's data plane in the kernel (docs/netns.md, "The kernel data plane").

Each cabled host port is a veth pair: the port's name (p0, ...) in its host's namespace, `f<i>` in the run's
fabric namespace (`testbed-<tag>-+fabric`: '+' never comes from a host name). The fabric namespace holds no
address and forwards nothing, so a frame entering it is dropped, unless an ingress filter (tc u32, match all,
mirred redirect) sends it on to the interface of the host port the transmitter's light reaches: one filter per
lit direction, read from the same light paths as the relays (LightPaths.landing), so a circuit, a re-pointed or
moving port, a chip's setting, a trunk or the loss budget decide the kernel's forwarding as they decide the
switches' power readings. A dark direction has no filter. The filters follow the switches within a tick.

Each host also has a data address on `data0` (a bridge with no ports: an interface to name, GLOO_SOCKET_IFNAME,
that holds one address) and forwards (ip_forward, in its namespace only). A launch's routes (`routes`) give every
host of the job a /32 to each other's data address over the job's directed links, through other hosts where the
topology needs it, with the next hop's MAC set: the host routing a lab sets up for a job's topology.

Netlink runs on a thread of the plane's own, one worker of an executor (pyroute2's synchronous API cannot run on
the twin's loop), which keeps the fabric namespace's socket and opens a host's when it needs one (each socket is
made inside its namespace); the loop computes the light and hands the thread the changes.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections import deque
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from emulators.dataplane.paths import FibreEnd, LightPaths
from emulators.netns import NS_PREFIX, NetnsError, entered

FABRIC = "+fabric"  # testbed-<tag>-+fabric
DATA_IFNAME = "data0"
RESERVED = {"lo", "mgmt0", DATA_IFNAME}
IFNAME = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")
TICK_S = 0.005  # how often the light is read; longer when reading it takes longer (see _tick)
TICK_SHARE = 0.1  # at most this share of the loop's time goes to reading the light
INGRESS = 0xFFFF0000  # the ingress qdisc's handle (tc's "ffff:")
PRIO = 1
ETH_P_ALL = 0x0003
RTNH_F_ONLINK = 4
NUD_PERMANENT = 0x80
HISTORY = 256


def fabric_ns(tag: str) -> str:
    return f"{NS_PREFIX}{tag}-{FABRIC}"


class KernelPlane:
    """A run's kernel data plane over its management network's namespaces."""

    def __init__(
        self,
        paths: LightPaths,
        tag: str,
        namespaces: Mapping[str, str],
        addresses: Mapping[str, str],
    ):
        self.paths = paths
        self.namespace = fabric_ns(tag)
        self.namespaces = dict(namespaces)  # host -> its namespace
        self.addresses = dict(addresses)  # host -> its data address
        self.ends: list[FibreEnd] = [f for f in paths.fibres.values() if f.host in self.namespaces]
        for end in self.ends:
            if not IFNAME.match(end.port) or end.port in RESERVED:
                raise NetnsError(
                    f"--netns: host port {end.label} cannot be an interface name (1-15 of A-Z a-z 0-9 _ . -, "
                    f"not {', '.join(sorted(RESERVED))}): rename the port in the inventory"
                )
        self.fabric_if: dict[tuple[str, str], int] = {}  # host port -> its interface in the fabric namespace
        self.port_if: dict[tuple[str, str], int] = {}  # host port -> its interface in the host's namespace
        self.port_mac: dict[tuple[str, str], str] = {}  # host port -> its interface's MAC address
        self.wanted: dict[tuple[str, str], tuple[str, str] | None] = {}  # what the light says, on the loop
        self.applied: dict[tuple[str, str], tuple[str, str] | None] = {}  # what the kernel does, on the thread
        # host -> data address -> (next hop's data address, the port to it, the MAC of the next hop's port)
        self.routes_of: dict[str, dict[str, tuple[str, str, str]]] = {}
        self.events: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self.changes = 0
        self.tick_s = TICK_S
        self._fabric: Any = None  # the fabric namespace's IPRoute, used on the thread only
        self._netlink: ThreadPoolExecutor | None = None  # the thread
        self._timer = None

    # ---- set-up and tear-down -----------------------------------------------------------------------------

    def up(self) -> None:
        """Make the fabric namespace, each host port's veth pair, the data addresses; start the netlink thread."""
        self._netlink = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kernel-plane")
        self._netlink.submit(self._build).result()

    def close(self) -> None:
        """Stop following the light and end the thread (the namespaces go with the management network)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._netlink is not None:
            self._netlink.submit(self._close_fabric).result()
            self._netlink.shutdown()
            self._netlink = None

    def _thread(self) -> ThreadPoolExecutor:
        """The netlink thread, between up() and close()."""
        assert self._netlink is not None, "the kernel data plane is not up"
        return self._netlink

    def _close_fabric(self) -> None:
        if self._fabric is not None:
            self._fabric.close()  # it holds the fabric namespace
            self._fabric = None

    def _build(self) -> None:
        from pyroute2 import netns

        netns.create(self.namespace)
        fabric = self._fabric = _socket(self.namespace)
        _sysctl(self.namespace, {"ipv6/conf/all/disable_ipv6": 1, "ipv6/conf/default/disable_ipv6": 1})
        for namespace in self.namespaces.values():
            _sysctl(
                namespace,
                {
                    "ipv4/ip_forward": 1,  # a host forwards for its ring neighbours (docs/netns.md)
                    "ipv4/conf/all/rp_filter": 0,  # routes may differ per direction (ties between equal paths)
                    "ipv4/conf/default/rp_filter": 0,
                    "ipv4/conf/all/send_redirects": 0,
                    "ipv6/conf/default/disable_ipv6": 1,  # the ports and data0 carry IPv4 only
                },
            )
        # Few requests: each is a netlink round trip, and a 256-host fabric has 512 ports (docs/netns.md, start-up).
        for i, end in enumerate(self.ends):  # after the hosts' sysctls: a port is made with IPv6 off
            peer = {"ifname": end.port, "net_ns_fd": self.namespaces[end.host]}
            fabric.link("add", ifname=f"f{i}", kind="veth", peer=peer, state="up")
        index = {msg.get_attr("IFLA_IFNAME"): msg["index"] for msg in fabric.get_links()}
        for i, end in enumerate(self.ends):
            fabric.tc("add", "ingress", index[f"f{i}"], "ffff:")
            self.fabric_if[(end.host, end.port)] = index[f"f{i}"]
            self.applied[(end.host, end.port)] = self.wanted[(end.host, end.port)] = None  # dark: no filter
        for host, namespace in self.namespaces.items():
            with _socket(namespace) as inner:
                inner.link("add", ifname=DATA_IFNAME, kind="bridge", state="up")
                links = {msg.get_attr("IFLA_IFNAME"): msg for msg in inner.get_links()}
                inner.addr("add", index=links[DATA_IFNAME]["index"], address=self.addresses[host], prefixlen=32)
                for end in self.ends:
                    if end.host == host:
                        port = links[end.port]
                        inner.link("set", index=port["index"], state="up")
                        self.port_if[(end.host, end.port)] = port["index"]
                        self.port_mac[(end.host, end.port)] = port.get_attr("IFLA_ADDRESS")

    # ---- following the light (on the twin's loop) ----------------------------------------------------------

    def watch(self, loop) -> None:
        """Read the light now and every tick from now on, on `loop`."""
        self._timer = loop.call_soon(self._tick, loop)

    def _tick(self, loop) -> None:
        started = time.monotonic()
        changed = self._read_light(started)
        if changed:
            self._thread().submit(self._apply_light, changed, started).add_done_callback(self._keep_error)
        # Reading a large fabric takes a while: the tick stretches so the loop keeps most of its time.
        took = time.monotonic() - started
        self.tick_s = max(TICK_S, took / TICK_SHARE)
        self._timer = loop.call_later(self.tick_s, self._tick, loop)

    def _read_light(self, now: float) -> dict:
        """Each host port whose light now lands elsewhere than the kernel was last told: (its receiver, why)."""
        cache: dict = {}
        changed = {}
        for end in self.ends:
            key = (end.host, end.port)
            reached, why = self.paths.landing(end, now, cache)
            target = None if reached is None else (reached.host, reached.port)
            if target != self.wanted[key]:
                self.wanted[key] = target
                changed[key] = (target, why)
        return changed

    def _keep_error(self, done: Future) -> None:
        """A change of the light has no caller to tell of its failure: the plane's events keep it."""
        exc = done.exception()
        if exc is not None:
            self.events.append({"t": time.monotonic(), "error": f"{type(exc).__name__}: {exc}"})

    def _apply_light(self, changed: dict, seen: float) -> None:
        fabric = self._fabric
        for key, (target, why) in changed.items():
            index = self.fabric_if[key]
            if self.applied.get(key) is not None:
                fabric.tc("del-filter", index=index, parent=INGRESS, prio=PRIO, protocol=ETH_P_ALL)
            if target is not None:
                fabric.tc(
                    "add-filter",
                    "u32",
                    index,
                    parent=INGRESS,
                    prio=PRIO,
                    protocol=ETH_P_ALL,
                    target=0x10001,
                    keys=["0x0/0x0+0"],  # every frame
                    action={
                        "kind": "mirred",
                        "direction": "egress",
                        "action": "redirect",
                        "ifindex": self.fabric_if[target],
                    },
                )
            self.applied[key] = target
            self.changes += 1
            self.events.append(
                {
                    "t": seen,
                    "applied": time.monotonic(),
                    "from": f"{key[0]}:{key[1]}",
                    "to": None if target is None else f"{target[0]}:{target[1]}",
                    "why": why,
                }
            )

    # ---- a launch's routes ------------------------------------------------------------------------------------

    def routes(self, links: Iterable[Iterable[str]]) -> dict[str, int]:
        """The routes of a launch whose traffic goes over `links` ([host, port, peer, peer's port]: host transmits
        on port to peer's port; a duplex link is two): each host on them reaches every other at its data address
        along a shortest path, one-way rings included (the way back goes round). They replace the routes of the
        launch before, on every host. Returns each host's route count.
        """
        graph: dict[str, list[tuple[str, str]]] = {}  # host -> [(its port, the neighbour it transmits to)]
        receiver: dict[tuple[str, str, str], str] = {}  # (host, port, neighbour) -> the neighbour's port
        for link in links:
            host, port, peer, peer_port = (str(x) for x in link)
            for end in ((host, port), (peer, peer_port)):
                if end not in self.port_if:
                    raise ValueError(f"{end[0]}:{end[1]} is not a host port of this twin's kernel data plane")
            if (port, peer) not in graph.setdefault(host, []):
                graph[host].append((port, peer))
                receiver[(host, port, peer)] = peer_port
        wanted: dict[str, dict[str, tuple[str, str, str]]] = {host: {} for host in self.namespaces}  # dst -> via
        for host in graph:
            for dst, (port, hop) in _first_hops(graph, host).items():
                mac = self.port_mac[(hop, receiver[(host, port, hop)])]
                wanted[host][self.addresses[dst]] = (self.addresses[hop], port, mac)
        # The light as it is now, in the kernel before the launch's ranks start: a frame (a SYN, an ARP request)
        # sent in the tick after a rewiring would be lost and retried only a second later.
        now = time.monotonic()
        self._thread().submit(self._apply_light, self._read_light(now), now).result()
        self._thread().submit(self._apply_routes, wanted).result()
        return {h: len(r) for h, r in wanted.items() if r}

    def _apply_routes(self, wanted: dict[str, dict[str, tuple[str, str, str]]]) -> None:
        for host, routes in wanted.items():
            have = self.routes_of.get(host, {})
            if routes == have:
                continue
            hops = {(hop, port): mac for hop, port, mac in routes.values()}
            stale = {(hop, port) for hop, port, _ in have.values()} - hops.keys()
            with _socket(self.namespaces[host]) as ipr:
                for dst in have.keys() - routes.keys():
                    with contextlib.suppress(Exception):  # gone with its port already
                        ipr.route("del", dst=f"{dst}/32")
                for hop, port in stale:
                    with contextlib.suppress(Exception):
                        ipr.neigh("del", dst=hop, ifindex=self.port_if[(host, port)])
                # The next hop's MAC is set, not asked for: ARP needs light both ways, which a one-way ring has not,
                # and a lab whose circuits change under its hosts sets its neighbours with its routes as well.
                for (hop, port), mac in hops.items():
                    ipr.neigh("replace", dst=hop, lladdr=mac, ifindex=self.port_if[(host, port)], state=NUD_PERMANENT)
                for dst, (hop, port, mac) in routes.items():
                    if have.get(dst) == (hop, port, mac):
                        continue
                    ipr.route(
                        "replace",
                        dst=f"{dst}/32",
                        gateway=hop,
                        oif=self.port_if[(host, port)],
                        flags=RTNH_F_ONLINK,  # the next hop is whoever the port's circuit reaches: no subnet says so
                        prefsrc=self.addresses[host],
                    )
            self.routes_of[host] = dict(routes)

    # ---- state ------------------------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        counters = self._thread().submit(self._counters).result()
        return {
            "namespace": self.namespace,
            "tick_ms": round(self.tick_s * 1000, 3),
            "addresses": dict(self.addresses),
            "directions": [
                {"from": f"{h}:{p}", "to": None if t is None else f"{t[0]}:{t[1]}", **counters[(h, p)]}
                for (h, p), t in sorted(self.applied.items())
            ],
            "routes": {
                h: {d: {"via": v, "port": p} for d, (v, p, _) in r.items()} for h, r in self.routes_of.items() if r
            },
            "changes": self.changes,
            "events": list(self.events),
        }

    def _counters(self) -> dict[tuple[str, str], dict[str, int]]:
        """Per host port, what its transmitter sent into the fabric (the fabric side's received counters)."""
        by_index = {}
        for msg in self._fabric.get_links():
            stats = msg.get_attr("IFLA_STATS64") or {}
            by_index[msg["index"]] = {
                "bytes": int(stats.get("rx_bytes", 0)),
                "packets": int(stats.get("rx_packets", 0)),
            }
        return {key: by_index.get(index, {"bytes": 0, "packets": 0}) for key, index in self.fabric_if.items()}


def _socket(namespace: str):
    """A netlink socket in `namespace` (it acts in the namespace it was made in, whichever thread uses it)."""
    from pyroute2 import IPRoute

    with entered(namespace):
        return IPRoute()


def _first_hops(graph: Mapping[str, list[tuple[str, str]]], source: str) -> dict[str, tuple[str, str]]:
    """Breadth first from `source`: each host it reaches -> (source's port, the neighbour) the path starts with.
    Neighbours are taken in the order the links were given, so equal paths are chosen the same way every time.
    """
    first: dict[str, tuple[str, str]] = {}
    frontier = [source]
    seen = {source}
    while frontier:
        following = []
        for host in frontier:
            for port, neighbour in graph.get(host, []):
                if neighbour in seen:
                    continue
                seen.add(neighbour)
                first[neighbour] = (port, neighbour) if host == source else first[host]
                following.append(neighbour)
        frontier = following
    return first


def _sysctl(namespace: str, values: Mapping[str, int]) -> None:
    """Write /proc/sys/net/... in `namespace` (the files are the namespace of the thread that opens them)."""
    with entered(namespace):
        for key, value in values.items():
            with open(f"/proc/sys/net/{key}", "w") as fh:
                fh.write(f"{value}\n")
