"""GPU-hour allocations per project, the append-only quota ledger and the matching Slurm limits."""
