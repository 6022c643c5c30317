"""The twin's management network: each emulated GPU host a network namespace of its own (docs/netns.md).

`ManagementNetwork(tag, hosts)` makes, with pyroute2 (netlink, no `ip` commands):
- one Linux bridge in the caller's namespace, `tb<tag>`, holding the control side's address (the subnet's first);
- per host a namespace `testbed-<tag>-<host>` (a file under /run/netns, as `ip netns add` makes it), with its
  loopback up and one veth, `mgmt0` inside, `tb<tag>h<i>` on the bridge outside, with the host's address.
The tag (six hex digits of the run's id) is in every name, so parallel runs and `testbed heal` tell whose
each namespace and link is; every interface name fits the kernel's 15 characters.

`entered(name)` moves the calling *thread* into a namespace and back (setns(CLONE_NEWNET) acts on the
calling thread only): a socket keeps the namespace it was made in, and a process or thread started from that
thread starts in it. The twin makes each host's listening sockets and starts its processes that way.

`remove(tag)` ends what a run with that tag left: the processes inside its namespaces, the namespaces, its
links. It recognises only names carrying the tag.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import hashlib
import ipaddress
import os
import re
import select
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
NS_PREFIX = "testbed-"  # testbed-<tag>-<host>
LINK_PREFIX = "tb"  # tb<tag> (the bridge), tb<tag>h<i> (a host's veth, bridge side)
HOST_IFNAME = "mgmt0"  # the host's management interface, inside its namespace
TAG_LEN = 6
MAX_HOSTS = 9999  # tb + 6 + h + 4 digits = 13 characters, under IFNAMSIZ - 1 = 15
# Candidate subnets: /22s (1022 addresses: a host per address beyond the control side's) in 10.0.0.0/8, which
# no public address uses. A run takes the first, from a place its tag picks, that overlaps no route or address
# of the machine (any table) and no other run's (docs/netns.md).
POOL = ipaddress.IPv4Network("10.0.0.0/8")
PREFIX = 22
LOCK_FILE = "/run/testbed-netns.lock"  # serialises choosing a subnet between runs starting together
EXIT_WAIT_S = 5.0

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


class NetnsError(RuntimeError):
    """The management network could not be made (permissions, a kernel without veth or bridge support)."""


def tag_of(run_id: str) -> str:
    """The short tag a run's names carry: six hex digits of its id."""
    return hashlib.sha256(run_id.encode()).hexdigest()[:TAG_LEN]


def ns_name(tag: str, host: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", host)
    return f"{NS_PREFIX}{tag}-{safe}"


def bridge_name(tag: str) -> str:
    return f"{LINK_PREFIX}{tag}"


def veth_name(tag: str, index: int) -> str:
    return f"{LINK_PREFIX}{tag}h{index}"


def missing_privilege() -> str | None:
    """Why this process cannot make namespaces and links, or None if it can (root, or CAP_NET_ADMIN and
    CAP_SYS_ADMIN, which mounting /run/netns needs).
    """
    if os.geteuid() == 0:
        return None
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                caps = int(line.split()[1], 16)
                if caps & (1 << 12) and caps & (1 << 21):  # CAP_NET_ADMIN, CAP_SYS_ADMIN
                    return None
    except (OSError, ValueError):
        pass
    return "network namespaces need root, or the capabilities CAP_NET_ADMIN and CAP_SYS_ADMIN"


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def entered(name: str | None) -> Iterator[None]:
    """The calling thread in namespace `name` (a name under /run/netns) for the block; None: as it is."""
    if name is None:
        yield
        return
    here = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        there = os.open(NETNS_DIR / name, os.O_RDONLY)
        try:
            _setns(there)
        finally:
            os.close(there)
        try:
            yield
        finally:
            _setns(here)
    finally:
        os.close(here)


@dataclass
class ManagementNetwork:
    """A run's management network: its bridge, and a namespace and an address per host (docs/netns.md)."""

    tag: str
    hosts: list[str]
    subnet: ipaddress.IPv4Network | None = None
    addresses: dict[str, str] = field(default_factory=dict)  # host -> its address
    data_subnet: ipaddress.IPv4Network | None = None  # the kernel data plane's (emulators/dataplane/kernel.py)
    namespaces: dict[str, str] = field(default_factory=dict)  # host -> its namespace's name
    _made: list[str] = field(default_factory=list)  # namespaces made, for down()

    @property
    def gateway(self) -> str:
        """The control side's address on the network (the bridge's)."""
        assert self.subnet is not None
        return str(self.subnet.network_address + 1)

    @property
    def bridge(self) -> str:
        return bridge_name(self.tag)

    def up(self) -> None:
        """Make the bridge, then each host's namespace, veth and address; on a failure, undo what was made."""
        if len(self.hosts) > MAX_HOSTS:
            raise NetnsError(f"--netns: at most {MAX_HOSTS} hosts (interface names are 15 characters)")
        why = missing_privilege()
        if why is not None:
            raise NetnsError(f"--netns: {why}")
        from pyroute2 import IPRoute

        try:
            with IPRoute() as ipr:
                self._bridge_up(ipr)
                for index, host in enumerate(self.hosts):
                    self._host_up(ipr, index, host)
        except BaseException:
            self.down()
            raise

    def _bridge_up(self, ipr) -> None:
        NETNS_DIR.mkdir(parents=True, exist_ok=True)
        with open(LOCK_FILE, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a subnet chosen and taken before another run looks
            self.subnet = self.subnet or free_subnet(self.tag, ipr)
            ipr.link("add", ifname=self.bridge, kind="bridge")
            index = ipr.link_lookup(ifname=self.bridge)[0]
            ipr.addr("add", index=index, address=self.gateway, prefixlen=self.subnet.prefixlen)
            ipr.link("set", index=index, state="up")
            # Data addresses live only inside the hosts' namespaces; the subnet differs from the management one
            # (now a route here, so passed over) for a host's routes to tell the two apart.
            self.data_subnet = self.data_subnet or free_subnet(self.tag, ipr)

    def _host_up(self, ipr, index: int, host: str) -> None:
        from pyroute2 import IPRoute, netns

        name = ns_name(self.tag, host)
        netns.create(name)
        self._made.append(name)
        outside = veth_name(self.tag, index)
        ipr.link("add", ifname=outside, kind="veth", peer={"ifname": HOST_IFNAME, "net_ns_fd": name})
        link = ipr.link_lookup(ifname=outside)[0]
        ipr.link("set", index=link, master=ipr.link_lookup(ifname=self.bridge)[0], state="up")
        assert self.subnet is not None  # chosen by _bridge_up, before any host
        address = _nth_host(self.subnet, index)
        with entered(name), IPRoute() as inner:  # a netlink socket made in the host's namespace
            inner.link("set", index=inner.link_lookup(ifname="lo")[0], state="up")
            mgmt = inner.link_lookup(ifname=HOST_IFNAME)[0]
            inner.addr("add", index=mgmt, address=address, prefixlen=self.subnet.prefixlen)
            inner.link("set", index=mgmt, state="up")
        self.addresses[host] = address
        self.namespaces[host] = name

    def down(self) -> list[str]:
        """Everything the network holds gone: the processes in its namespaces, the namespaces, its links."""
        return remove(self.tag)

    @property
    def data_addresses(self) -> dict[str, str]:
        """Host -> its address on the kernel data plane (emulators/dataplane/kernel.py): numbered as on this network."""
        assert self.data_subnet is not None
        return {host: _nth_host(self.data_subnet, i) for i, host in enumerate(self.hosts)}

    def describe(self) -> dict:
        """What the twin announces (and run.json records, for heal)."""
        return {
            "tag": self.tag,
            "subnet": str(self.subnet),
            "gateway": self.gateway,
            "bridge": self.bridge,
            "data_subnet": str(self.data_subnet),
            "hosts": {h: {"netns": self.namespaces[h], "address": self.addresses[h]} for h in self.hosts},
            "data": self.data_addresses,
        }


def free_subnet(tag: str, ipr) -> ipaddress.IPv4Network:
    """A /22 of 10.0.0.0/8 that overlaps no address or route of this machine, starting where the tag points."""
    taken = []
    for route in ipr.route("dump", family=2, table=0):  # every table, the local one's addresses included
        dst = route.get("RTA_DST")  # None: a default route, which overlaps every subnet and rules out none
        if dst is not None:
            taken.append(ipaddress.ip_network(f"{dst}/{route['dst_len']}", strict=False))
    for msg in ipr.addr("dump", family=2):
        taken.append(ipaddress.ip_network(f"{msg.get('IFA_ADDRESS')}/{msg['prefixlen']}", strict=False))
    taken = [t for t in taken if t.prefixlen > 0]
    count = 2 ** (PREFIX - POOL.prefixlen)
    start = int(tag, 16) % count
    for step in range(count):
        candidate = _nth(POOL, PREFIX, (start + step) % count)
        if not any(candidate.overlaps(t) for t in taken):
            return candidate
    raise NetnsError(f"--netns: no /{PREFIX} of {POOL} is free of this machine's routes and addresses")


def _nth_host(subnet: ipaddress.IPv4Network, index: int) -> str:
    """Host `index`'s address in a subnet: the first goes to the control side (the bridge), then one per host."""
    return str(subnet.network_address + 2 + index)


def _nth(pool: ipaddress.IPv4Network, prefix: int, n: int) -> ipaddress.IPv4Network:
    size = 2 ** (32 - prefix)
    return ipaddress.IPv4Network(f"{ipaddress.IPv4Address(int(pool.network_address) + n * size)}/{prefix}")


# --- what a run left ----------------------------------------------------------------------------------------


def namespaces_of(tag: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(f"{NS_PREFIX}{tag}-"))
    except FileNotFoundError:
        return []


def links_of(tag: str) -> list[str]:
    """The run's links in this namespace: its bridge and the bridge ends of its veths."""
    pattern = re.compile(rf"^{LINK_PREFIX}{re.escape(tag)}(h\d+)?$")
    return sorted(n for n in os.listdir("/sys/class/net") if pattern.match(n))


def pids_in(names: list[str]) -> list[int]:
    """The processes of this machine whose network namespace is one of `names` (by device and inode)."""
    wanted = set()
    for name in names:
        with contextlib.suppress(OSError):
            st = os.stat(NETNS_DIR / name)
            wanted.add((st.st_dev, st.st_ino))
    out = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        with contextlib.suppress(OSError):
            st = os.stat(f"/proc/{entry}/ns/net")
            if (st.st_dev, st.st_ino) in wanted:
                out.append(int(entry))
    return out


def leftovers(tag: str) -> dict[str, list]:
    names = namespaces_of(tag)
    return {"namespaces": names, "links": links_of(tag), "processes": pids_in(names)}


def remove(tag: str) -> list[str]:
    """End the processes in the run's namespaces (SIGKILL, waited for), remove the namespaces and the run's
    links; returns what was removed, as lines. Only names carrying the tag are touched.
    """
    done = []
    names = namespaces_of(tag)
    pids = _kill(pids_in(names))
    if pids:
        done.append(f"ended {len(pids)} process(es) in the run's namespaces: {pids}")
    for name in names:
        path = NETNS_DIR / name
        _libc.umount2(str(path).encode(), 2)  # MNT_DETACH: the namespace goes once nothing holds it
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    if names:
        done.append(f"removed {len(names)} network namespace(s): {', '.join(names)}")
    links = links_of(tag)
    if links:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            for link in links:
                with contextlib.suppress(Exception):  # a veth gone with its namespace meanwhile
                    ipr.link("del", ifname=link)
        done.append(f"removed {len(links)} link(s): {', '.join(links)}")
    return done


def _kill(pids: list[int]) -> list[int]:
    fds = {}
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        except ProcessLookupError:
            os.close(fd)
            continue
        fds[fd] = pid
    deadline = time.monotonic() + EXIT_WAIT_S
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    waiting = set(fds)
    while waiting and (left := deadline - time.monotonic()) > 0:
        for fd, _ in poller.poll(left * 1000):
            waiting.discard(fd)
            poller.unregister(fd)
    for fd in fds:
        os.close(fd)
    return sorted(fds.values())
