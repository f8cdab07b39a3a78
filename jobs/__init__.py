"""Clusters, jobs and their Slurm side: submission, state sync, log streaming, and the slurmrestd client."""
