"""Photonic-chip logic shared by the mesh drivers: layout and routing, schedules, calibration."""
