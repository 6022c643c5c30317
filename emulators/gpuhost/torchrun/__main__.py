"""`python -m emulators.gpuhost.torchrun ARGS`: how an emulated host runs `torchrun` (host.py, LAUNCHERS)."""

from emulators.gpuhost.torchrun.launcher import main

if __name__ == "__main__":
    raise SystemExit(main())
