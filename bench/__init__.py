"""Herald's benchmarks: measurements, never pass/fail tests. `make bench` runs them all."""
