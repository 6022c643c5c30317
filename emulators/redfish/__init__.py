"""Emulated BMCs speaking Redfish (the DMTF standard), one per emulated GPU host: service.py is one BMC's
resources and power control without a transport, server.py serves every BMC of a twin over HTTPS.
"""

from emulators.redfish.server import RedfishServer
from emulators.redfish.service import RESET_TYPES, RedfishService

# The BMC account of every emulated host; its password is the twin's published one (emulators/frontends.py).
TWIN_BMC_USER = "admin"

__all__ = ["RESET_TYPES", "TWIN_BMC_USER", "RedfishServer", "RedfishService"]
