"""The twin's emulated data plane: traffic between job ranks flows only along lit light paths."""

from emulators.dataplane.paths import LightPaths, parse_fibres
from emulators.dataplane.plane import DataPlane

__all__ = ["DataPlane", "LightPaths", "parse_fibres"]
