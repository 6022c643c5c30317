"""An emulated programmable photonic chip (MZI mesh): physics engine, Qontrol and SCPI front ends."""
