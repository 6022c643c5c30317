"""Which VISA library a VISA transport opens its resources with: `visa_library` (docs/protocols.md §6.1).

pyvisa names a library as `ARGUMENT@BACKEND`; the three this project knows:

- `@py` (the default): pyvisa-py, pure Python (TCPIP SOCKET, ASRL, and what else pyvisa-py speaks);
- `@ivi`, or `PATH@ivi`, or a bare `PATH`: the vendor's VISA (NI-VISA, Keysight IO Libraries), found by pyvisa or
  loaded from PATH; needed for GPIB, for most USB-TMC instruments and for VISA aliases;
- `FILE.yaml@sim`: pyvisa-sim, which answers from the definition file FILE (no process, no network); the project
  ships one for its Polatis switch (drivers/scpi/polatis-sim.yaml).

Parsing here only reads the text; whether FILE exists and defines a resource is `sim_resources` (the inventory
asks both when it is loaded, the transport again when it opens the resource).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT = "@py"
BACKENDS = ("py", "ivi", "sim")
SHIPPED_SIM = "drivers/scpi/polatis-sim.yaml"  # as a user of a source checkout names it (docs/protocols.md §6.2)

_CHOICES = (
    "use '@py' (pyvisa-py, the default), '@ivi' or the path of the vendor's VISA library such as "
    "'/usr/lib/x86_64-linux-gnu/libvisa.so.0@ivi' (NI-VISA, Keysight: GPIB, USB-TMC), or a pyvisa-sim "
    f"definition file as 'path/to/file.yaml@sim' (this project ships {SHIPPED_SIM})"
)


@dataclass(frozen=True)
class VisaLibrary:
    """A parsed `visa_library`: the backend ("py", "ivi" or "sim") and its argument ("" if none)."""

    backend: str
    argument: str  # ivi: the vendor library's path ("" = let pyvisa look); sim: the definition file; py: ""

    @property
    def spec(self) -> str:
        """The library as pyvisa.ResourceManager takes it, a pyvisa-sim file made absolute (pyvisa keys its
        libraries by this text: one file named two ways would be two simulated instruments with two states).
        """
        if self.backend == "sim":
            return f"{Path(self.argument).expanduser().absolute()}@sim"
        return f"{self.argument}@{self.backend}"

    def __str__(self) -> str:
        return f"{self.argument}@{self.backend}"


def parse_visa_library(text: object) -> VisaLibrary:
    """`text` as a VisaLibrary; a ValueError saying what to write instead for anything else."""
    if not isinstance(text, str):
        raise ValueError(f"expected a string such as '@py', got {text!r}; {_CHOICES}")
    value = text.strip()
    if not value:
        raise ValueError(f"is empty; {_CHOICES}")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError(f"{text!r} contains a control character; {_CHOICES}")
    argument, at, backend = value.rpartition("@")
    if not at:  # pyvisa's own rule: a bare path is the vendor's library
        return VisaLibrary("ivi", value)
    backend = backend.strip().lower()
    argument = argument.strip()
    if backend not in BACKENDS:
        raise ValueError(f"{value!r}: unknown VISA backend '@{backend}'; {_CHOICES}")
    if backend == "py" and argument:
        raise ValueError(f"{value!r}: pyvisa-py takes no path, write '@py'")
    if backend == "sim" and not argument:
        raise ValueError(
            f"{value!r}: pyvisa-sim needs the definition file of the simulated instrument, e.g. "
            f"'{SHIPPED_SIM}@sim' (its own bundled examples are no device of this project)"
        )
    return VisaLibrary(backend, argument)


def sim_resources(path: str) -> list[str]:
    """The resources a pyvisa-sim definition file defines, in pyvisa's canonical form; a ValueError naming the
    file and what is wrong with it (missing, not YAML, no `resources`).
    """
    import yaml
    from pyvisa.rname import InvalidResourceName, to_canonical_name

    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(
            f"the pyvisa-sim definition file {path} does not exist (relative paths are from the directory testbed "
            f"runs in: {Path.cwd()}); give its path, e.g. '{SHIPPED_SIM}@sim'"
        )
    try:
        # pyvisa-sim reads every scalar as a string (BaseLoader); so does this, so both see the same keys
        data = yaml.load(file.read_text(encoding="utf-8"), Loader=yaml.BaseLoader)  # noqa: S506 (BaseLoader builds only str, list, dict)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"the pyvisa-sim definition file {path} cannot be read: {first}") from None
    resources = data.get("resources") if isinstance(data, dict) else None
    if not isinstance(resources, dict) or not resources:
        raise ValueError(
            f"the pyvisa-sim definition file {path} defines no resources (a top-level 'resources:' mapping of "
            "resource names to devices)"
        )
    names = []
    for name in resources:
        try:
            names.append(to_canonical_name(name))
        except InvalidResourceName:
            raise ValueError(
                f"the pyvisa-sim definition file {path} names a resource {name!r} pyvisa cannot parse"
            ) from None
    return names


def canonical_resource(resource: str) -> str | None:
    """The resource as pyvisa-sim looks it up (`TCPIP::x::5025::SOCKET` is `TCPIP0::x::5025::SOCKET`), or None."""
    from pyvisa.rname import InvalidResourceName, to_canonical_name

    try:
        return to_canonical_name(resource)
    except InvalidResourceName:
        return None
