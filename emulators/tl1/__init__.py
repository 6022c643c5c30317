"""TL1 management interfaces on the emulated optical switch (docs/protocols.md §8).

`grammar` cuts the byte stream into commands, parses one command and frames the switch's output (both
dialects); `frontend` serves the Polatis and Calient dialects on the one switch model (emulators/scpi/ocs.py).
"""
