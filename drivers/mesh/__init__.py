"""Photonic MZI-mesh drivers (PhotonicMesh capability): Qontrol line protocol and SCPI source."""

from drivers.mesh.base import MeshDriver, NotCalibrated
from drivers.mesh.qontrol import QontrolMesh
from drivers.mesh.scpi import ScpiMesh

__all__ = ["MeshDriver", "NotCalibrated", "QontrolMesh", "ScpiMesh"]
