"""Executes a plan on Ray: one actor per device, a coordinator for the steps, a recorder for events."""
