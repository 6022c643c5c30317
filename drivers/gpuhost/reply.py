"""Reading what a GPU host printed: the error a reader raises, and what a number looks like.

The readers (nvidia-smi's CSV, `ps`, a job's log tail) are pure functions of the text: they know what is
wrong with it and what to try, not which host printed it nor what was sent. They raise BadReply; the driver
turns it into the DeviceError it names, adding the host, the command and its output.
"""

from __future__ import annotations

import re

from drivers.errors import DeviceError

# A pid or a step number: ASCII digits (str.isdigit() also accepts '²', which int() refuses), and not
# thousands of them (int() refuses those too).
NUMBER = re.compile(r"^[0-9]{1,18}$")


class BadReply(Exception):
    """A host's output is not what the command should print, or it reports that the command failed.

    `error` is the DeviceError subclass the driver raises for it, `message` and `hint` that error's own.
    """

    def __init__(self, error: type[DeviceError], message: str, hint: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message
        self.hint = hint
