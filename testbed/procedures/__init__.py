"""What every family's procedures share: the context a procedure runs in (marks, a per-device cache), the
error a failed verification raises, and the light and read-back checks of a circuit change.

A procedure runs inside a device's actor, next to the driver, so that its timestamps are taken where the I/O
happens. Each is a plain function `(driver, ctx, **kwargs) -> JSON-able value`, registered by its family
(testbed/families); testbed.families.PROCEDURES holds them all by name."""
