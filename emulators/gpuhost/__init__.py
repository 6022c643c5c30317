"""Emulated GPU hosts: an SSH server per host in front of a restricted shell (nvidia-smi, dmesg, job
control, the host's own files) and real job processes from an allowlist. See device.py for the twin's
adapter, host.py for the state and control ops, shell/ for the command language, torchrun/ for its torchrun.
"""
