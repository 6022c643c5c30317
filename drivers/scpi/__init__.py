"""The SCPI optical circuit switch (Polatis's SCPI dialect) and its audit model."""
