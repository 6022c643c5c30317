"""The twin's emulated data plane: traffic between job ranks flows only along lit light paths, through one
switch or several (over trunks), within each path's loss budget.
"""

from emulators.dataplane.paths import LightPaths, couple_trunk_light, parse_fibres, parse_trunks
from emulators.dataplane.plane import DataPlane

__all__ = ["DataPlane", "LightPaths", "couple_trunk_light", "parse_fibres", "parse_trunks"]
