"""What a TL1 response's completion code and error code mean: the response to use, or the error to raise.

A COMPLD (or DELAY) response is the answer; a DENY or PRTL is a `Tl1Denied` that names the 4-letter error
code, its meaning and what to try; any other completion code is a protocol error. Pure: no I/O.
"""

from __future__ import annotations

import re

from drivers.errors import DeviceCommandError, DeviceProtocolError
from drivers.transports.tl1_messages import Tl1Message

# Generic TL1 error codes (Telcordia GR-833 appendix, as the Symmetricom and ADTRAN TL1 manuals list them).
MEANINGS = {
    "ICNV": "command not valid",
    "IIAC": "invalid access identifier (port)",
    "IICT": "invalid correlation tag",
    "IITA": "invalid target identifier",
    "IISP": "invalid syntax or punctuation",
    "IDNV": "data not valid",
    "IPNV": "parameter not valid",
    "IPMS": "parameter missing",
    "IPEX": "extra parameter",
    "INUP": "unimplemented non-null parameter",
    "PIUI": "input user not valid",
    "PICC": "invalid command code (login)",
    "PLNA": "login not active",
    "SNVS": "not in valid state",
    "SROF": "requested operation failed",
    "SARB": "system resources are busy",
    "ENEQ": "not equipped",
}
HINTS = {
    "IIAC": "a port (access identifier) is not one this switch has; check the port numbers",
    "SNVS": "a port or connection is in the wrong state (in use by another circuit, or not active): "
    "read connections() and disconnect first",
    "PLNA": "the session is not logged in (the switch may have logged it out): retry; if it persists, "
    "check the user's privileges on the switch",
    "PIUI": "check the user name in the inventory and the password",
    "SROF": "the switch failed the operation: look at its alarms (RTRV-ALM-ALL) and retry",
    "SARB": "the switch is busy: retry later",
    "IITA": "the target identifier does not name this switch: the driver sends none, so check the switch",
}
FORM_HINT = "the switch does not accept this command form; check its model and TL1 firmware version"


class Tl1Denied(DeviceCommandError):
    """The switch answered DENY (or PRTL): `code` is its 4-letter error code, `response` the whole block."""

    def __init__(self, message: str, *, code: str, response: Tl1Message | None = None, **kwargs) -> None:
        self.code = code
        self.response = response
        super().__init__(message, **kwargs)

    def __reduce__(self):
        fields = (self.message, self.code, self.device, self.address, self.sent, self.received, self.hint)
        return (_rebuild_denied, fields)


def _rebuild_denied(message, code, device, address, sent, received, hint):
    return Tl1Denied(message, code=code, device=device, address=address, sent=sent, received=received, hint=hint)


def accepted(response: Tl1Message, *, sent: str, device: str, address: str, hints: dict[str, str]) -> Tl1Message:
    """`response` to the command `sent` (as audited) if the switch carried it out (COMPLD, DELAY).

    Raises Tl1Denied for DENY or PRTL, its hint taken from `hints` by error code (FORM_HINT for a code they
    lack), and DeviceProtocolError for any other completion code.
    """
    verb = sent.split(":", 1)[0]
    if response.code in ("COMPLD", "DELAY"):
        return response
    if response.code in ("DENY", "PRTL"):
        words = response.words
        code = next((w for w in words if re.fullmatch(r"[A-Z]{4}", w)), words[0] if words else "")
        why = "; ".join(response.comments)
        outcome = "denied" if response.code == "DENY" else "partly carried out (PRTL)"
        raise Tl1Denied(
            f"the switch {outcome} {verb}: {code or '?'} ({MEANINGS.get(code, 'unknown error code')})"
            + (f": {why}" if why else ""),
            code=code,
            response=response,
            device=device,
            address=address,
            sent=sent,
            received=response.text.strip(),
            hint=hints.get(code, FORM_HINT),
        )
    raise DeviceProtocolError(
        f"unexpected completion code {response.code} for {verb}",
        device=device,
        address=address,
        sent=sent,
        received=response.text.strip(),
        hint="the driver expects COMPLD or DENY; check the switch's TL1 firmware version",
    )


def combined_refusals(errors: list[Tl1Denied], after: str, device: str, address: str) -> DeviceCommandError:
    """One error for several refusals (commands sent together, or with check=False before check_errors())."""
    if len(errors) == 1:
        return errors[0]
    first = errors[0]
    return DeviceCommandError(
        f"the switch refused {len(errors)} command(s) of {after}; the first: {first.message}",
        device=device,
        address=address,
        sent="\n".join(e.sent or "" for e in errors),
        received="\n".join(str(e.received) for e in errors),
        hint=first.hint,
    )
