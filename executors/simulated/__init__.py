"""The simulated executor: the performance model's numbers, optionally on real Ray GPU reservations."""
