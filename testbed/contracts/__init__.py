"""What every layer agrees on: what a device can do (capabilities), the errors users see, the registries' type."""
