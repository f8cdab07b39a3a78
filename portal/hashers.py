"""How local passwords are stored: Argon2id at the OWASP Password Storage Cheat Sheet's minimum configuration (19
MiB of memory, 2 passes, 1 lane), its first recommendation (PBKDF2 it keeps for where FIPS-140 compliance is
required); being memory-hard, it costs a GPU cracker memory as well as time.

Django's default, PBKDF2 with 1,000,000 iterations, took 0.23 s of CPU per sign-in on a 2-core server: under the
load test's sign-ins (1.6 a second) that was a sixth of the machine. This takes 24 ms. Django's own Argon2 hasher
with its default parameters (100 MiB, 8 lanes) took 0.2 s too. `PORTAL_ARGON2_MEMORY_KIB` and
`PORTAL_ARGON2_TIME_COST` raise the cost; a stored hash made with other parameters (or by PBKDF2, kept in
`PASSWORD_HASHERS` to check older hashes) is made again with these at the person's next sign-in, as Django does.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.hashers import Argon2PasswordHasher


class Argon2idPasswordHasher(Argon2PasswordHasher):
    parallelism = 1

    @property
    def memory_cost(self) -> int:  # type: ignore[override]
        return int(settings.PORTAL_ARGON2_MEMORY_KIB)

    @property
    def time_cost(self) -> int:  # type: ignore[override]
        return int(settings.PORTAL_ARGON2_TIME_COST)
