"""The failure watch's command and how it reads a log line (drivers/gpuhost/watch.py), on the text alone."""

from __future__ import annotations

import re

import pytest

from drivers.capabilities import JobHandle, WatchEvent
from drivers.errors import DeviceCommandError
from drivers.gpuhost import GpuHostSsh
from drivers.gpuhost.watch import ALIVE, GONE, line_event, watch_command
from drivers.transports.ssh import StreamChunk

JOB = JobHandle("gpu01", "train", 4242, "testbed-jobs/my train/train.log", "testbed-jobs/my train")
STEP = re.compile(r"step (\d+)")


def test_the_watch_follows_the_log_until_the_pid_has_exited_zombie_or_not():
    assert watch_command(JOB, 0.05, 0) == (
        r"{ while grep -sqE '\) [^ZX]( -?[0-9]+)+$' /proc/4242/stat ; do sleep 0.05 ; done ; "
        "echo 'testbed-watch: gone' >&2 ; } & "
        "tail -n 0 -s 0.01 --pid $! -F 'testbed-jobs/my train/train.log' ; exit $?"
    )


def test_the_whole_log_first_or_its_last_lines():
    assert " tail -n +1 -s 0.05 " in watch_command(JOB, 0.25, None)
    assert " tail -n 20 -s 0.2 " in watch_command(JOB, 1.0, 20)
    assert "do sleep 1 ;" in watch_command(JOB, 1.0, 20)


@pytest.mark.parametrize(
    ("stat", "alive"),
    [
        ("4242 (python3) S 1 4242 4242 0 -1 4194560 0 0 0 0 -2 0", True),
        ("4242 (python3) R 1 4242 4242 0 -1 4194560 0 0 0 0 -2 0", True),
        ("4242 (python3) T 1 4242 4242 0 -1 4194560 0 0 0 0 -2 0", True),
        ("4242 (python3) Z 1 4242 4242 0 -1 4194560 0 0 0 0 -2 0", False),
        ("4242 (python3) X 1 4242 4242 0 -1 4194560 0 0 0 0 -2 0", False),
        ("4242 (a) R 1 (b) Z 1 4242 0 -1 4194560 0 0 0 0 -2 0", False),  # a name holding ") R 1 ("
        ("4242 (a) Z 1 (b) S 1 4242 0 -1 4194560 0 0 0 0 -2 0", True),
    ],
)
def test_the_alive_pattern_reads_the_state_after_the_last_parenthesis(stat, alive):
    assert (re.search(ALIVE, stat) is not None) == alive


def test_a_line_matching_the_progress_pattern_is_progress_with_its_step():
    assert line_event(b"step 12 loss 0.3\r", STEP, 99) == WatchEvent("progress", "step 12 loss 0.3", 12, 99)


def test_any_other_line_is_a_line_and_bytes_that_are_not_utf8_survive():
    assert line_event(b"loading \xff data", STEP, 5) == WatchEvent("line", "loading \\xff data", None, 5)
    assert line_event(b"step 3", None, 5) == WatchEvent("line", "step 3", None, 5)


def test_a_match_that_is_not_a_number_is_progress_without_a_step():
    assert line_event(b"step ab", re.compile(r"step (\w+)"), 1) == WatchEvent("progress", "step ab", None, 1)
    assert line_event(b"step \xc2\xb2", re.compile(r"step (\w+)"), 1).step is None  # '²' is a digit to str, not to int
    assert line_event(b"epoch done", re.compile(r"epoch"), 1) == WatchEvent("progress", "epoch done", None, 1)


class Host:
    """What a host sends back on the watch's channel, in order (the transport's chunks)."""

    address = "lab@gpu01:22"

    def __init__(self, *chunks: StreamChunk) -> None:
        self.chunks = chunks

    def stream(self, command, idle_s):
        yield from self.chunks


def test_the_loop_saying_gone_is_the_exit_seen_before_the_log_last_lines_and_the_watch_end():
    host = Host(
        StreamChunk("out", b"step 7\n", 1),
        StreamChunk("err", b"testbed-wa", 2),  # the word may come in two packets
        StreamChunk("err", b"tch: gone\n", 3),
        StreamChunk("out", b"error: rank 1 lost its GPU\n", 4),
        StreamChunk("exit", b"", 5, status=0),
    )
    events = list(GpuHostSsh(host, "gpu01").watch(JOB, progress=r"step (\d+)"))
    assert [(e.kind, e.line, e.monotonic_ns) for e in events] == [
        ("progress", "step 7", 1),
        ("gone", None, 3),
        ("line", "error: rank 1 lost its GPU", 4),
        ("exited", None, 5),
    ]


def test_the_loop_word_is_not_part_of_a_failed_watch_error():
    host = Host(
        StreamChunk("err", (GONE + "\ntail: cannot follow\n").encode(), 2),
        StreamChunk("exit", b"", 3, status=1),
    )
    with pytest.raises(DeviceCommandError) as err:
        list(GpuHostSsh(host, "gpu01").watch(JOB))
    assert err.value.received == "tail: cannot follow\n" and "exit status 1: tail: cannot follow" in str(err.value)
