"""Which spec dataclass and which adapter serve each kind of emulated device, named as "module:Name" and
imported only when a twin serves that kind.

The built-in kinds are below; a twin spec can name more (TwinSpec.kinds: a device family from another
package brings its own emulator, and the testbed side puts its references in the spec it sends). An adapter
starts the device's endpoints and answers its control ops (emulators.devices.EmulatedDevice).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence

# kind -> (spec dataclass, adapter class)
BUILTIN_KINDS: dict[str, tuple[str, str]] = {
    "ocs": ("emulators.spec:OcsSpec", "emulators.devices:OcsDevice"),
    "photonic_mesh": ("emulators.mesh.spec:MeshSpec", "emulators.mesh.device:MeshDevice"),
    "gpu_host": ("emulators.gpuhost.spec:GpuHostSpec", "emulators.gpuhost.device:GpuHostAdapter"),
}


def load(ref: str):
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def refs(kind: str, extra: Mapping[str, Sequence[str]] | None = None) -> tuple[str, ...]:
    # (spec class, adapter class); another package's as the twin's spec carries them (JSON: a list)
    known: dict[str, Sequence[str]] = {**BUILTIN_KINDS, **(extra or {})}
    if kind not in known:
        raise ValueError(f"unknown emulated device kind {kind!r} (known: {', '.join(sorted(known))})")
    return tuple(known[kind])


def spec_class(kind: str, extra: Mapping[str, Sequence[str]] | None = None) -> type:
    return load(refs(kind, extra)[0])


def adapter_class(kind: str, extra: Mapping[str, Sequence[str]] | None = None) -> type:
    return load(refs(kind, extra)[1])
