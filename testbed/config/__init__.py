"""The configuration language: YAML with line marks, name ranges and templates, and the base models every
family, step and fault builds its own on (names, ports, devices, transports, cabling, jobs). It knows no
family, step or fault kind: testbed.documents assembles the whole inventory and playbook from them.
"""
