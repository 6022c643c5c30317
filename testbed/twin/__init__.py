"""The bridge to the emulated twin: the only way from testbed into emulators/ (docs/architecture.md)."""
