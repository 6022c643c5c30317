"""testbed: experiments on photonic ML-datacenter testbeds, on the lab or on its emulated twin."""

__version__ = "0.1.0"
