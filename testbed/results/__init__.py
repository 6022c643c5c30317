"""A run's results: the recorder that writes them, the run folder, and what reads them back (report, plots,
compare, milestones, accuracy against the twin's ground truth).
"""
