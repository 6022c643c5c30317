"""Protocol-level emulators of the lab's devices, and the coupled twin that runs them."""
