"""SCPI: the protocol engine every SCPI-speaking emulator builds on, and the Polatis-style switch on it."""
