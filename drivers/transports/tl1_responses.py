"""The commands in flight on one TL1 session and the switch's output filed under them, by CTAG.

The switch's output is a stream of blocks (drivers/transports/tl1_messages.py reads them). Autonomous messages
may arrive between any two blocks, and a response to an earlier command that timed out may arrive late: responses
and in-progress acknowledgments go to the command that carries their CTAG, autonomous messages are kept aside
(`autonomous`, newest last) and the rest is dropped. No I/O: drivers/transports/tl1.py feeds it what it reads.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from drivers.transports.tl1_messages import Tl1Message, Tl1Reader

MAX_CTAG = 999_999  # CTAGs are 1 to 6 characters; this one counts 1..999999 and wraps
KEPT = 256  # autonomous messages kept for the caller


@dataclass
class Outstanding:
    """A command sent and not answered yet: what it was (as audited), its response so far."""

    shown: str  # the command as audited (the password masked)
    parts: list[Tl1Message] = field(default_factory=list)  # blocks of its response, the last one ended by `>`
    done: bool = False
    acks: int = 0  # in-progress acknowledgments (`IP <ctag>`) received for it
    acked_at: float = float("-inf")  # when the last one came


class Tl1Responses:
    """The CTAGs of one TL1 session: the next one to use, the commands waiting under theirs, what arrived."""

    def __init__(self) -> None:
        self.autonomous: deque[Tl1Message] = deque(maxlen=KEPT)  # never replaced: a transport hands it out
        self._reader = Tl1Reader()
        self._ctag = 0
        self._outstanding: dict[str, Outstanding] = {}  # CTAG -> command, in the order sent

    def next_ctag(self) -> str:
        """A CTAG for the next command (1..MAX_CTAG, then again from 1)."""
        self._ctag = self._ctag % MAX_CTAG + 1
        return str(self._ctag)

    def expect(self, ctag: str, shown: str) -> None:
        """Wait for the response to the command `shown`, just sent with `ctag`."""
        self._outstanding[ctag] = Outstanding(shown)

    def waiting(self, ctag: str) -> Outstanding | None:
        """The command sent with `ctag`, while its response is awaited."""
        return self._outstanding.get(ctag)

    def forget(self, ctag: str) -> None:
        """Stop waiting for the response to `ctag` (one that comes later is dropped)."""
        self._outstanding.pop(ctag, None)

    def feed(self, text: str) -> None:
        """File what the switch sent under the commands waiting for it; ValueError if it is not TL1."""
        for message in self._reader.feed(text):
            waiting = self._outstanding.get(message.tag)
            if message.kind == "autonomous":
                self.autonomous.append(message)
            elif waiting is None or waiting.done:
                continue  # an answer to a command no longer waited for (it timed out), or not ours
            elif message.kind == "ack":
                waiting.acks += 1
                waiting.acked_at = time.monotonic()
            else:
                waiting.parts.append(message)
                waiting.done = not message.more

    def reset(self) -> None:
        """A new connection: nothing is in flight and no block is half read (the CTAG count goes on)."""
        self._reader = Tl1Reader()
        self._outstanding.clear()
