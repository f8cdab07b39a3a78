"""The POSIX user on each cluster from a sign-in's claims (DirectoryPosixUsername), applied by tenants.directory.

Registered at start-up (clusters.apps), so that tenants/ never imports clusters/. A claim that is missing, is
not a POSIX user name, or names a user another person already runs as on that cluster refuses the sign-in
(DirectoryConflict: the transaction rolls back and the admins are told).
"""

from __future__ import annotations

import re

from clusters.models import POSIX_USERNAME_PATTERN, ClusterAccount, DirectoryPosixUsername
from clusters.services import cluster_account_set
from tenants.directory import DirectoryConflict, SignInClaims


def directory_posix_usernames_apply(sign_in: SignInClaims) -> None:
    mappings = DirectoryPosixUsername.objects.select_related("cluster").filter(
        provider=sign_in.provider_id, cluster__is_active=True
    )
    for mapping in mappings:
        cluster = mapping.cluster
        username = sign_in.claims.get(mapping.claim)
        if not username:
            raise DirectoryConflict(
                f"{sign_in.provider_name} did not send your POSIX user name (the '{mapping.claim}' claim), which "
                f"this portal needs to run your jobs on cluster '{cluster.name}'."
            )
        if not isinstance(username, str) or not re.fullmatch(POSIX_USERNAME_PATTERN, username):
            raise DirectoryConflict(
                f"Your POSIX user name from {sign_in.provider_name} ('{username}', the '{mapping.claim}' claim) is "
                f"not one cluster '{cluster.name}' can run jobs as."
            )
        taken = (
            ClusterAccount.objects.filter(cluster=cluster, username=username)
            .exclude(user=sign_in.user)
            .select_related("user")
            .first()
        )
        if taken is not None:
            raise DirectoryConflict(
                f"Your POSIX user name '{username}' on cluster '{cluster.name}' already belongs to another portal "
                f"account ('{taken.user.get_username()}')."
            )
        cluster_account_set(actor=None, cluster=cluster, user=sign_in.user, username=username)
