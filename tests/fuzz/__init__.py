"""Differential fuzzing of partir (issue 26 item 5): random JAX programs, meshes and
schedules (generator.py, as data: program.py), run in watchdogged worker processes against
jax.jit and the Core interpreter (runner.py), failures shrunk (minimize.py), campaigns
summarized (campaign.py). scripts/fuzz.py runs long campaigns; test_fuzz.py a fixed set of
seeds in the suite."""
