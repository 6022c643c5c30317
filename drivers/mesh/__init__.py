"""Photonic MZI-mesh drivers (PhotonicMesh capability): Qontrol line protocol and SCPI source."""

from .base import MeshDriver, NotCalibrated
from .qontrol import QontrolMesh
from .scpi import ScpiMesh

__all__ = ["MeshDriver", "NotCalibrated", "QontrolMesh", "ScpiMesh"]
