"""Driver x fault matrix for the GPU-host SSH driver (drivers/transports/ssh.py, drivers/gpuhost/), through the
twin's fault proxy in front of the emulated host's SSH server.

Host key checking stays on through the proxy: the twin's known_hosts lists the host's real key under the
proxy's port, and the driver connects with paramiko's RejectPolicy as it does in the lab.

Two operations, for every proxy fault kind:
- "health": the gpu.health procedure (nvidia-smi query + kernel log) in the runner's DeviceActor (used
  in-process, without Ray), which records each call as ok, fail or info;
- "watch": the streaming watch of a running job (GpuHostSsh.watch: `tail -F` on one channel) that is live
  when the fault starts.

What a user relies on: every call and every step of a watch ends (never a hang: one that does not is
pytest-timeout's to fail, no wall-clock bound is asserted), a timeout naming the timeout it waited out; a failure
is a typed DeviceError (never a paramiko / socket exception); a call that sent its command and then lost
the connection is "info"; once the proxy is healed the same driver object works again (reconnecting when
its connection died). A watch either raises a typed error or keeps yielding events (progress lines, or
idle heartbeats that let the caller's stall timeout fire): "progress" / "idle" below say which it did in
the WINDOW after the fault started. EXPECTED is the observed behaviour, made explicit per fault.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import pytest
from fault_harness import PROXY_FAULTS, TYPED, inject_proxy_fault, make_actor, names_timeout

from drivers.capabilities import JobHandle
from drivers.errors import DeviceConnectionError, DeviceError
from drivers.transports.ssh import SshSettings
from emulators.gpuhost.spec import GpuHostSpec
from emulators.spec import TwinSpec
from emulators.twin import TwinProcess
from testbed.families.drivers import make_driver

DEVICE = "gpu01"
HOST = GpuHostSpec(DEVICE, gpus=2, seed=5, jobs=("testbed-train",))
TIMEOUT = 1.0  # SSH timeout (connect, banner, auth, channel, exec), s
HEARTBEAT = 0.05  # the watch's idle heartbeat, s
WINDOW = TIMEOUT * 1.5  # how long a faulted watch is followed

OK, INFO, FAIL = "ok", "info", "fail"
TMO, CONN = "DeviceTimeout", "DeviceConnectionError"
PROGRESS, IDLE = "progress", "idle"

# fault -> (status, error type) of each of the two faulted gpu.health calls. Every fault here shows first on
# the reply to opening the exec channel, before the command is sent: the transport drops the connection,
# reconnects once, and that fails during the handshake, so the call certainly did not run: "fail". (An exec
# whose command went out and whose answer was lost is "info": tests/gpuhost/test_gpuhost_hostile.py.)
# Timing (observed): a stall costs a channel timeout plus a banner timeout per call; the others are fast.
EXPECTED_HEALTH: dict[str, tuple[tuple[str, str | None], ...]] = {
    "latency_above": ((FAIL, CONN), (FAIL, CONN)),  # channel open times out; the new banner comes too late
    "latency_below": ((OK, None), (OK, None)),
    "bandwidth": ((OK, None), (OK, None)),
    "slow_close": ((OK, None), (OK, None)),  # sshd closes nothing while a client is connected
    "timeout": ((FAIL, CONN), (FAIL, CONN)),  # as latency_above: the stall shows as timeouts
    "reset_peer": ((FAIL, CONN), (FAIL, CONN)),  # RST on the channel-open reply, then on the new banner
    "slicer": ((OK, None), (OK, None)),
    "limit_data": ((FAIL, CONN), (FAIL, CONN)),  # cut in the channel-open reply, then in the new banner
    "down": ((FAIL, CONN), (FAIL, CONN)),  # connection closed, reconnect refused
}

# fault -> what the live watch did after the fault: PROGRESS, IDLE or the error class it raised. IDLE is
# a stalled connection: heartbeats keep coming (the gpu.watch_job procedure turns their lack of progress
# into a "stall" detection); the watch does not raise, as a quiet job looks the same.
EXPECTED_WATCH: dict[str, str] = {
    "latency_above": IDLE,
    "latency_below": PROGRESS,
    "bandwidth": PROGRESS,
    "slow_close": PROGRESS,
    "timeout": IDLE,
    "reset_peer": CONN,
    "slicer": PROGRESS,
    "limit_data": CONN,
    "down": CONN,
}


@pytest.fixture(scope="module")
def twin() -> Iterator[TwinProcess]:
    with TwinProcess(TwinSpec([HOST], fault_proxy=True)) as tw:
        yield tw


def settings(twin: TwinProcess, role: str = "ssh") -> SshSettings:
    ends = twin.endpoints.devices[DEVICE]
    host, port = ends[role].rsplit(":", 1)
    return SshSettings(host, ends["user"], int(port), ends["key_file"], ends["known_hosts"], timeout_s=TIMEOUT)


@pytest.fixture(scope="module")
def job(twin: TwinProcess) -> Iterator[JobHandle]:
    """A training job printing a step every 50 ms for the whole module, started on the host's own port."""
    driver = make_driver("ssh", DEVICE, settings(twin, "ssh_direct"))
    try:
        handle = driver.run_job(["testbed-train", "--steps", "1000000", "--step-time", "0.05"], name="train")
        yield handle
        driver.stop_job(handle, grace_s=2.0)
    finally:
        driver.close()


@pytest.fixture
def ctl(twin: TwinProcess):
    control = twin.control
    control.call(None, "proxy.reset")
    yield control
    control.call(None, "proxy.reset")


def test_the_tables_cover_every_fault():
    assert set(EXPECTED_HEALTH) == set(EXPECTED_WATCH) == set(PROXY_FAULTS)


def test_known_hosts_lists_the_proxied_port_with_the_real_host_key(twin):
    ends = twin.endpoints.devices[DEVICE]
    proxied, direct = settings(twin), settings(twin, "ssh_direct")
    assert proxied.port != direct.port
    lines = dict(line.split(" ", 1) for line in open(ends["known_hosts"]).read().splitlines())
    assert lines[proxied.host_key_name] == lines[direct.host_key_name]  # one host, one key, both ports


def test_host_key_checking_stays_on_through_the_proxy(twin, ctl, tmp_path):
    # A known_hosts that lists the host under its own port only: through the proxy the key is unknown.
    ends = twin.endpoints.devices[DEVICE]
    direct = settings(twin, "ssh_direct").host_key_name
    only_direct = tmp_path / "known_hosts"
    only_direct.write_text("".join(f"{line}\n" for line in open(ends["known_hosts"]) if line.startswith(direct + " ")))
    proxied = dataclasses.replace(settings(twin), known_hosts=str(only_direct))
    driver = make_driver("ssh", DEVICE, proxied)
    try:
        with pytest.raises(DeviceConnectionError, match="is not in"):
            driver.gpus()
    finally:
        driver.close()


@pytest.mark.parametrize("fault", PROXY_FAULTS)
def test_health(twin, ctl, fault):
    actor = make_actor(DEVICE, "ssh", settings(twin))
    try:
        result = actor.run("gpu.health", {})
        assert result.status == OK and result.value["ok"], result.error  # a live connection for the fault
        inject_proxy_fault(ctl, DEVICE, fault, TIMEOUT)

        seen = []
        for _ in range(2):
            result = actor.run("gpu.health", {})
            if result.status != OK:
                assert result.error_type in TYPED, result.error  # never a paramiko or socket exception
                assert DEVICE in result.error and "try:" in result.error, result.error
            if result.error_type == "DeviceTimeout":
                assert names_timeout(result.error, TIMEOUT), result.error
            seen.append((result.status, result.error_type))
        assert tuple(seen) == EXPECTED_HEALTH[fault]

        ctl.call(DEVICE, "proxy.reset")  # heal
        result = actor.run("gpu.health", {})
        assert result.status == OK and result.value["ok"], result.error
    finally:
        actor.close()


def follow(watch: Iterator, seconds: float) -> tuple[str, list[str]]:
    """Read the watch for `seconds`: (what it did, the event kinds). A step that never ends is a hang, for
    pytest-timeout to fail.
    """
    kinds: list[str] = []
    start = time.monotonic()
    progressed = False
    while time.monotonic() - start < seconds:
        try:
            event = next(watch)
        except DeviceError as exc:
            assert DEVICE in str(exc) and exc.hint, exc
            return type(exc).__name__, kinds
        now = time.monotonic()
        kinds.append(event.kind)
        # Progress in the second half of the window: lines still flow, not only those buffered earlier.
        progressed |= event.kind == "progress" and now - start > seconds / 2
    return (PROGRESS if progressed else IDLE), kinds


def first_progress(watch: Iterator) -> None:
    """Until the watch shows a progress line (a watch that never does is pytest-timeout's to fail)."""
    for event in watch:
        if event.kind == "progress":
            return
    raise AssertionError("the watch ended without progress")


@pytest.mark.parametrize("fault", PROXY_FAULTS)
def test_watch(twin, ctl, job, fault):
    driver = make_driver("ssh", DEVICE, settings(twin))
    try:
        watch = driver.watch(job, heartbeat_s=HEARTBEAT, lines=0)
        first_progress(watch)  # live
        inject_proxy_fault(ctl, DEVICE, fault, TIMEOUT)
        outcome, kinds = follow(watch, WINDOW)
        watch.close()  # closes the channel: must not hang on a dead connection either (pytest-timeout's to catch)
        assert outcome == EXPECTED_WATCH[fault], kinds

        ctl.call(DEVICE, "proxy.reset")  # heal
        again = driver.watch(job, heartbeat_s=HEARTBEAT, lines=0)
        try:
            first_progress(again)  # the same driver object, reconnected if its connection died
        finally:
            again.close()
    finally:
        driver.close()
