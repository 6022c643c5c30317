"""A host's power through its BMC: Redfish over HTTPS with DMTF's own client library (`bmc`), over an HTTP
transport held to what a hostile or broken BMC must not be able to do to it (`http`).
"""

from drivers.redfish.bmc import RedfishBmc, RedfishSettings

__all__ = ["RedfishBmc", "RedfishSettings"]
