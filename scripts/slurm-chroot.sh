#!/usr/bin/env bash
# A whole GPU Slurm cluster of a newer Slurm generation, from Debian's own packages in a debootstrap chroot:
#   slurm-chroot.sh {up|down|status|stop DAEMON|build} CLUSTER
#
#   north   Debian 13 "trixie"    Slurm 24.11   2 nodes x 4 fake l40s   slurmrestd 127.0.0.1:6920
#   south   Debian unstable "sid" Slurm 26.05   2 nodes x 4 fake h200   slurmrestd 127.0.0.1:7020
# Network (topology/tree): node 01 under leaf switch leaf1, node 02 under leaf2, one spine above both.
#
# Each cluster is complete and its own: slurmctld, two slurmd, slurmdbd on the host's MariaDB (own database),
# slurmrestd with JWT, own ClusterName, ports, state, logs and key. Processes in a chroot share the host's
# loopback, so everything listens on 127.0.0.1 with its own ports. Jobs run as the same POSIX users as on the
# host (same names and uids) and write their output under /srv/gpuportal, bind-mounted from the host, so the
# portal reads a job's log at the very path Slurm wrote it to.
#
# The chroot is built once (about a minute, ~300 MB) and reused; a missing or broken one is rebuilt. Without
# the Debian package registry the build fails with a message, exit status 3, and the other clusters still work.
# Unstable moves: the Slurm version is read from the chroot at run time, never assumed.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CHROOT_ROOT=${GPUPORTAL_CHROOT_ROOT:-/var/lib/gpuportal/chroots}
REGISTRY_DIR=${GPUPORTAL_CLUSTER_REGISTRY:-/var/lib/gpuportal/clusters}  # one JSON file per cluster, read by the demo and tests
SHARED_FS=/srv/gpuportal                   # bind-mounted into every chroot at the same path
MIRROR=${DEBIAN_MIRROR:-}
WAIT_SECS=${CLUSTER_WAIT_SECS:-90}
EXIT_UNAVAILABLE=3
DB_USER=slurm
DB_PASS=slurm-dev-password  # dev-only; MariaDB listens on loopback only
REST_USER=slurmrestd
HOST=$(hostname -s)
# Host users whose jobs the clusters run: the demo's and the tests' users, plus every ordinary user of the host.
BASE_USERS=(alice bob carol dana)
PACKAGES=slurmctld,slurmd,slurmdbd,slurmrestd,slurm-client,slurm-wlm-jwt-plugin,procps,curl,passwd

configure_cluster() {
    CLUSTER=$1
    LOG_TAG=$CLUSTER
    case $CLUSTER in
        north)
            SUITE=trixie GENERATION=24.11 GPU_TYPE=l40s
            CTLD_PORT=6917 DBD_PORT=6919 REST_PORT=6920 FIRST_NODE_PORT=17101
            ;;
        south)
            SUITE=sid GENERATION=26.05 GPU_TYPE=h200
            CTLD_PORT=7017 DBD_PORT=7019 REST_PORT=7020 FIRST_NODE_PORT=17201
            ;;
        *) die "unknown cluster '$CLUSTER' (known: north, south)" ;;
    esac
    ROOT=$CHROOT_ROOT/$SUITE
    NODES=("${CLUSTER}01" "${CLUSTER}02")
    GPUS_PER_NODE=4
    DB_NAME=slurm_acct_db_$CLUSTER
    JOB_LOG_ROOT=$SHARED_FS/logs-$CLUSTER
    REST_ADDR=127.0.0.1:$REST_PORT
    LOG_DIR=/var/log/slurm     # inside the chroot
    RUN_DIR=/run/slurm         # inside the chroot (a tmpfs)
    STATE_DIR=/var/lib/slurm   # inside the chroot
    JWT_KEY=/etc/slurm/jwt_hs256.key
}

LOG_TAG=chroot  # the cluster's name once it is known
in_root() { chroot "$ROOT" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin SLURM_CONF=/etc/slurm/slurm.conf "$@"; }
# Slurm's client commands run inside the cluster's chroot.
slurm() { in_root "$@"; }
# shellcheck source=scripts/lib/slurm-daemons.sh
source "$SCRIPT_DIR/lib/slurm-daemons.sh"

# --- the chroot --------------------------------------------------------------------------------------
mounts_under() { findmnt -rn -o TARGET | awk -v root="$1" 'index($0, root "/") == 1 || $0 == root' | sort -r; }

unmount_all() {
    local target
    while read -r target; do
        [[ -n $target ]] || continue
        umount "$target" 2>/dev/null || umount -l "$target"
    done < <(mounts_under "$ROOT")
}

chroot_works() {
    [[ -x $ROOT/usr/sbin/slurmctld && -x $ROOT/usr/sbin/slurmrestd && -x $ROOT/usr/sbin/useradd ]] || return 1
    compgen -G "$ROOT/usr/lib/*/slurm-wlm/auth_jwt.so" >/dev/null || return 1
    chroot "$ROOT" /usr/sbin/slurmctld -V >/dev/null 2>&1
}

mirror_url() {
    if [[ -n $MIRROR ]]; then echo "$MIRROR"; return; fi
    # The mirror this machine already uses for its own packages.
    local uri
    uri=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -n 1)
    [[ -n $uri ]] || uri=$(grep -hs '^deb ' /etc/apt/sources.list | awk '{print $2}' | head -n 1)
    echo "${uri:-http://deb.debian.org/debian}"
}

ensure_debootstrap() {
    command -v debootstrap >/dev/null 2>&1 && return 0
    log "installing debootstrap"
    # Both chroots are built side by side: the second install waits for the first one's dpkg lock (a fresh
    # machine marked a cluster unavailable when its install found the lock taken).
    local apt=(apt-get -o DPkg::Lock::Timeout=600 -y -qq)
    { DEBIAN_FRONTEND=noninteractive "${apt[@]}" install debootstrap >/dev/null 2>&1; } \
        || { DEBIAN_FRONTEND=noninteractive "${apt[@]}" update >/dev/null 2>&1 \
            && DEBIAN_FRONTEND=noninteractive "${apt[@]}" install debootstrap >/dev/null 2>&1; } \
        || unavailable "debootstrap is not installed and could not be installed from the Debian package registry"
}

# The cluster cannot be had on this machine: say why, record it for the portal and the tests, and exit 3.
unavailable() {
    printf '[%s] UNAVAILABLE: %s\n' "$CLUSTER" "$1" >&2
    printf '[%s] the other local clusters are unaffected\n' "$CLUSTER" >&2
    write_registry unavailable "$1"
    exit "$EXIT_UNAVAILABLE"
}

build_chroot() {
    if chroot_works; then
        return 0
    fi
    ensure_debootstrap
    if [[ -d $ROOT ]]; then
        log "the $SUITE chroot at $ROOT is incomplete or broken: rebuilding it"
        unmount_all
        [[ -z $(mounts_under "$ROOT") ]] || die "cannot unmount everything under $ROOT; not removing it"
        rm -rf --one-file-system "$ROOT"
    fi
    local building=$ROOT.building t0=$SECONDS mirror
    mirror=$(mirror_url)
    [[ -z $(mounts_under "$building") ]] || die "something is mounted under $building; not touching it"
    rm -rf --one-file-system "$building"
    install -d -m 755 "$CHROOT_ROOT"
    log "building a Debian $SUITE chroot with Slurm (debootstrap from $mirror; about a minute)"
    if ! debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$building" "$mirror" \
        >"$CHROOT_ROOT/$SUITE.debootstrap.log" 2>&1; then
        tail -n 5 "$CHROOT_ROOT/$SUITE.debootstrap.log" >&2 || true
        rm -rf --one-file-system "$building"
        unavailable "could not build the Debian $SUITE chroot for Slurm $GENERATION: debootstrap failed (is the Debian package registry reachable? log: $CHROOT_ROOT/$SUITE.debootstrap.log)"
    fi
    mv "$building" "$ROOT"
    chroot_works || unavailable "the Debian $SUITE chroot was built but its slurmctld does not run"
    log "built the $SUITE chroot in $((SECONDS - t0))s ($(du -sh "$ROOT" | cut -f1))"
}

ensure_mounts() {
    install -d "$ROOT/proc" "$ROOT/dev" "$ROOT/run" "$ROOT$SHARED_FS"
    install -d -m 755 "$SHARED_FS"
    mountpoint -q "$ROOT/proc" || mount --bind /proc "$ROOT/proc"
    mountpoint -q "$ROOT/dev" || mount --bind /dev "$ROOT/dev"
    mountpoint -q "$ROOT/run" || mount -t tmpfs -o mode=755,size=64m tmpfs "$ROOT/run"
    mountpoint -q "$ROOT$SHARED_FS" || mount --bind "$SHARED_FS" "$ROOT$SHARED_FS"
}

slurm_release() { in_root slurmctld -V 2>/dev/null | awk '{print $2}'; }

# --- users, keys, directories -------------------------------------------------------------------------
# The same POSIX users as the host, with the same uids and gids: a job's files on the shared filesystem
# belong to the same person whichever cluster ran it.
ensure_users() {
    in_root getent passwd "$REST_USER" >/dev/null || in_root useradd -M -r -s /usr/sbin/nologin -U "$REST_USER"
    local name uid gid home shell group
    while IFS=: read -r name _ uid gid _ home shell; do
        [[ -n $name ]] || continue
        group=$(getent group "$gid" | cut -d: -f1)
        [[ -n $group ]] || group=$name
        if ! in_root getent group "$group" >/dev/null; then
            in_root groupadd -g "$gid" "$group"
        fi
        if ! in_root getent passwd "$name" >/dev/null; then
            in_root useradd -M -u "$uid" -g "$gid" -d "$home" -s "$shell" "$name"
        elif [[ $(in_root id -u "$name") != "$uid" ]]; then
            in_root usermod -u "$uid" -g "$gid" "$name"
        fi
    done < <(host_users)
}

host_users() {
    local u
    for u in "${BASE_USERS[@]}"; do getent passwd "$u" || true; done
    getent passwd | awk -F: '$3 >= 1000 && $3 < 60000'
}

ensure_dirs() {
    local n
    install -d -m 755 "$ROOT/etc/slurm" "$ROOT$LOG_DIR" "$ROOT$STATE_DIR" "$ROOT$STATE_DIR/dev"
    install -d -m 700 "$ROOT$STATE_DIR/ctld"
    for n in "${NODES[@]}"; do install -d -m 755 "$ROOT$STATE_DIR/spool/$n"; done
    install -d -m 755 "$ROOT$RUN_DIR"
    # Fake GPUs: files that merely exist (see scripts/cluster.sh for why character devices).
    local i f
    for ((i = 0; i < GPUS_PER_NODE; i++)); do
        f=$ROOT$STATE_DIR/dev/nvidia$i
        [[ -c $f || -f $f ]] || mknod -m 666 "$f" c 195 "$i" 2>/dev/null || touch "$f"
    done
    install -d -o root -g root -m 755 "$JOB_LOG_ROOT"
    touch "$ROOT$LOG_DIR/slurmrestd.log"
    in_root chown "$REST_USER:$REST_USER" "$LOG_DIR/slurmrestd.log"
}

ensure_keys() {
    # auth/slurm: a shared key instead of munge. JWT: the key the portal's workers mint tokens with.
    local key
    for key in /etc/slurm/slurm.key "$JWT_KEY"; do
        if [[ ! -s $ROOT$key ]]; then
            log "creating $ROOT$key"
            (umask 077 && head -c 32 /dev/urandom >"$ROOT$key.tmp" && mv "$ROOT$key.tmp" "$ROOT$key")
        fi
        chown root:root "$ROOT$key"
        chmod 600 "$ROOT$key"
    done
}

write_configs() {
    # Without the host's names every lookup of this host's name (slurmctld does one per submission) asks the
    # DNS server, which does not answer here: measured 5 s per request on 24.11 before this file existed.
    install_file "$ROOT/etc/hosts" 644 < <(
        echo "# Generated by scripts/slurm-chroot.sh from the host's /etc/hosts"
        cat /etc/hosts
        grep -qw "$HOST" /etc/hosts || echo "127.0.0.1 $HOST"
    )
    local last_port=$((FIRST_NODE_PORT + ${#NODES[@]} - 1))
    install_file "$ROOT/etc/slurm/slurm.conf" 644 <<EOF
# Generated by scripts/slurm-chroot.sh -- edits are overwritten on the next "up".
# Slurm $GENERATION from Debian $SUITE: ${#NODES[@]} slurmd processes on loopback pretend to be GPU nodes.
ClusterName=$CLUSTER
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CTLD_PORT

# A shared key (/etc/slurm/slurm.key) instead of munge; JWT for slurmrestd and the portal's tokens.
AuthType=auth/slurm
CredType=cred/slurm
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$JWT_KEY

StateSaveLocation=$STATE_DIR/ctld
SlurmdSpoolDir=$STATE_DIR/spool/%n
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$RUN_DIR/slurmd-%n.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info

ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
LaunchType=launch/slurm
MailProg=/bin/true

SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=2

AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStorageTRES=gres/gpu,gres/gpu:$GPU_TYPE
AccountingStorageEnforce=associations,limits,qos,safe
AccountingStoreFlags=job_comment
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
JobCompType=jobcomp/none

PriorityType=priority/multifactor
PriorityDecayHalfLife=0
PriorityUsageResetPeriod=NONE

EnforcePartLimits=ALL
MaxJobCount=10000
MinJobAge=300
KillWait=5
InactiveLimit=0
SchedulerParameters=batch_sched_delay=0,sched_min_interval=50000,sched_interval=5,bf_interval=5

# The network (topology.conf): one node under each of two leaf switches, both under one spine, so a two-node
# job here always spans two switches (the local cluster's h100 pair shows the one-switch case). The feature
# switch-<leaf> says the same through slurmrestd, which shows no topology before Slurm 25.05.
TopologyPlugin=topology/tree

NodeName=${NODES[0]} NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$FIRST_NODE_PORT Sockets=2 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=32000 Gres=gpu:$GPU_TYPE:$GPUS_PER_NODE Features=switch-leaf1 State=UNKNOWN
NodeName=${NODES[1]} NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$last_port Sockets=2 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=32000 Gres=gpu:$GPU_TYPE:$GPUS_PER_NODE Features=switch-leaf2 State=UNKNOWN

PartitionName=debug Nodes=${CLUSTER}[01-02] Default=YES DefaultTime=00:10:00 MaxTime=30 State=UP
PartitionName=$GPU_TYPE Nodes=${CLUSTER}[01-02] DefaultTime=01:00:00 MaxTime=2-00:00:00 State=UP
EOF

    install_file "$ROOT/etc/slurm/gres.conf" 644 <<EOF
# Generated by scripts/slurm-chroot.sh -- fake GPUs.
NodeName=${CLUSTER}[01-02] Name=gpu Type=$GPU_TYPE File=$STATE_DIR/dev/nvidia[0-$((GPUS_PER_NODE - 1))]
EOF

    # topology.conf, not topology.yaml: all three generations read it (26.05 reads topology.yaml first when
    # there is one, and falls back to TopologyPlugin + topology.conf), so one format serves every cluster.
    install_file "$ROOT/etc/slurm/topology.conf" 644 < <(topology_conf "leaf1=${NODES[0]}" "leaf2=${NODES[1]}")

    # No cgroups in a chroot on this machine.
    install_file "$ROOT/etc/slurm/cgroup.conf" 644 <<EOF
# Generated by scripts/slurm-chroot.sh
CgroupPlugin=disabled
EOF

    install_file "$ROOT/etc/slurm/slurmdbd.conf" 600 <<EOF
# Generated by scripts/slurm-chroot.sh -- accounting daemon of cluster $CLUSTER.
AuthType=auth/slurm
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$JWT_KEY
DbdHost=$HOST
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
DebugLevel=info
LogFile=$LOG_DIR/slurmdbd.log
PidFile=$RUN_DIR/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3306
StorageUser=$DB_USER
StoragePass=$DB_PASS
StorageLoc=$DB_NAME
EOF
}

ensure_database() {
    bash "$SCRIPT_DIR/services.sh" up mariadb >/dev/null
    mysql -h 127.0.0.1 -u root <<SQL
CREATE DATABASE IF NOT EXISTS $DB_NAME;
CREATE USER IF NOT EXISTS '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL PRIVILEGES ON $DB_NAME.* TO '$DB_USER'@'127.0.0.1';
GRANT ALL PRIVILEGES ON $DB_NAME.* TO '$DB_USER'@'localhost';
SQL
}

# --- daemons -------------------------------------------------------------------------------------------
pidfile_of() {
    case $1 in
        slurmdbd | slurmctld | slurmrestd) echo "$ROOT$RUN_DIR/$1.pid" ;;
        *) echo "$ROOT$RUN_DIR/slurmd-$1.pid" ;;
    esac
}
logfile_of() {
    case $1 in
        slurmdbd | slurmctld | slurmrestd) echo "$ROOT$LOG_DIR/$1.log" ;;
        *) echo "$ROOT$LOG_DIR/slurmd-$1.log" ;;
    esac
}
binary_of() { case $1 in slurmdbd | slurmctld | slurmrestd) echo "$1" ;; *) echo slurmd ;; esac; }

# The pid, if the pid file names a live process of the right program whose root is this chroot.
daemon_pid() {
    local pf pid
    pf=$(pidfile_of "$1")
    [[ -r $pf ]] || return 1
    pid=$(tr -dc '0-9' <"$pf")
    [[ -n $pid ]] || return 1
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$(binary_of "$1")" ]] || return 1
    [[ $(readlink "/proc/$pid/root") == "$ROOT" ]] || return 1
    pid_alive "$pid" || return 1
    echo "$pid"
}
# Every process whose root is this chroot (what "down" must leave none of).
chroot_pids() {
    local p
    for p in /proc/[0-9]*; do
        [[ $(readlink "$p/root" 2>/dev/null) == "$ROOT" ]] && echo "${p#/proc/}"
    done
    return 0
}

slurmdbd_answers() { in_root timeout 10 sacctmgr -n -P list cluster format=cluster; }

start_slurmdbd() {
    if ! is_running slurmdbd; then
        log "starting slurmdbd"
        in_root slurmdbd || true
        check_started slurmdbd
    fi
    wait_for "slurmdbd to answer sacctmgr" "$(logfile_of slurmdbd)" slurmdbd_answers
    if ! in_root sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
        log "adding cluster $CLUSTER to its accounting database"
        in_root sacctmgr -i add cluster "$CLUSTER" >/dev/null
    fi
}

slurmctld_answers() { in_root scontrol ping 2>/dev/null | grep -q 'is UP'; }

start_slurmctld() {
    is_running slurmctld && return 0
    log "starting slurmctld"
    in_root slurmctld || true
    local i
    for ((i = 0; i < 50; i++)); do
        sleep 0.2
        is_running slurmctld || break
        slurmctld_answers && return 0
    done
    is_running slurmctld && return 0
    # Died at start-up: most likely state saved by an incompatible earlier configuration or release.
    local parked=$ROOT$STATE_DIR/ctld.broken-$(date +%Y%m%d-%H%M%S)
    log "slurmctld died at start-up; parking its state in $parked and starting clean"
    show_log "$(logfile_of slurmctld)"
    mv "$ROOT$STATE_DIR/ctld" "$parked"
    install -d -m 700 "$ROOT$STATE_DIR/ctld"
    in_root slurmctld || true
    check_started slurmctld
}

start_slurmds() {
    local n
    for n in "${NODES[@]}"; do
        if ! is_running "$n"; then
            log "starting slurmd $n"
            in_root slurmd -N "$n" || true
        fi
    done
    for n in "${NODES[@]}"; do check_started "$n"; done
}

start_slurmrestd() {
    is_running slurmrestd && return 0
    log "starting slurmrestd on $REST_ADDR"
    # slurmrestd refuses to run as root or SlurmUser; -u drops to its own user. It stays in the foreground.
    chroot "$ROOT" env -i PATH=/usr/sbin:/usr/bin SLURM_CONF=/etc/slurm/slurm.conf SLURM_JWT=daemon \
        setsid /usr/sbin/slurmrestd -u "$REST_USER" -g "$REST_USER" -a rest_auth/jwt "$REST_ADDR" \
        >>"$ROOT$LOG_DIR/slurmrestd.log" 2>&1 </dev/null &
    echo $! >"$(pidfile_of slurmrestd)"
    check_started slurmrestd
}

rest_answers() {
    local tok
    tok=$(root_token) || return 1
    [[ -n $tok ]] || return 1
    curl -sf --max-time 5 -H "X-SLURM-USER-NAME: root" -H "X-SLURM-USER-TOKEN: $tok" \
        "http://$REST_ADDR/openapi/v3" >/dev/null
}

# What the portal and the tests read to find this cluster.
write_registry() {
    local status=$1 reason=${2:-} release=""
    [[ $status == up ]] && release=$(slurm_release)
    registry_write "$REGISTRY_DIR/$CLUSTER.json" name="$CLUSTER" slurm_cluster_name="$CLUSTER" status="$status" \
        reason="$reason" slurm_generation="$GENERATION" slurm_release="$release" debian_suite="$SUITE" \
        slurmrestd_url="http://$REST_ADDR" jwt_key_file="$ROOT$JWT_KEY" admin_user=root log_root="$JOB_LOG_ROOT" \
        gpu_type="$GPU_TYPE" gpu_partition="$GPU_TYPE" gpus_per_node="$GPUS_PER_NODE" \
        nodes="[\"${NODES[0]}\", \"${NODES[1]}\"]" \
        switches="{\"leaf1\": [\"${NODES[0]}\"], \"leaf2\": [\"${NODES[1]}\"]}" chroot="$ROOT"
}

# --- commands ------------------------------------------------------------------------------------------
cmd_up() {
    local t0=$SECONDS
    build_chroot
    ensure_mounts
    ensure_users
    ensure_dirs
    ensure_keys
    write_configs
    if ((CONFIG_CHANGED)) && is_running slurmctld; then
        # slurmctld and the slurmds are started again below; slurmdbd.conf changes need down && up.
        stop_for_new_config
    fi
    ensure_database
    start_slurmdbd
    start_slurmctld
    wait_for "slurmctld to answer (scontrol ping)" "$(logfile_of slurmctld)" slurmctld_answers
    start_slurmds
    start_slurmrestd
    wait_for "all ${#NODES[@]} nodes to be idle" "$(logfile_of slurmctld)" nodes_ready
    wait_for "slurmrestd to answer /openapi/v3" "$(logfile_of slurmrestd)" rest_answers
    write_registry up
    log "Slurm $(slurm_release) cluster '$CLUSTER' up in $((SECONDS - t0))s: slurmrestd http://$REST_ADDR," \
        "nodes ${NODES[*]} (${GPUS_PER_NODE}x $GPU_TYPE each), key $ROOT$JWT_KEY, job output $JOB_LOG_ROOT"
}

cmd_down() {
    [[ -d $ROOT ]] || return 0
    local n pid
    stop_daemon slurmrestd
    for n in "${NODES[@]}"; do stop_daemon "$n"; done
    stop_daemon slurmctld
    stop_daemon slurmdbd
    # Anything else still running in the chroot (a job's processes, a stray client) goes too.
    for pid in $(chroot_pids); do kill -KILL "$pid" 2>/dev/null || true; done
    unmount_all
    log "down (chroot, config, keys and state kept for the next 'up')"
}

cmd_status() {
    local d pid
    if [[ ! -d $ROOT ]]; then
        printf '%-11s not built (%s)\n' "$CLUSTER" "$ROOT"
        return 0
    fi
    for d in slurmdbd slurmctld "${NODES[@]}" slurmrestd; do
        if pid=$(daemon_pid "$d"); then
            printf '%-11s running (pid %s)\n' "$d" "$pid"
        else
            printf '%-11s stopped\n' "$d"
        fi
    done
    if is_running slurmctld; then in_root sinfo; fi
}

cmd_stop() {
    local d
    for d in slurmdbd slurmctld slurmrestd "${NODES[@]}"; do
        [[ $1 == "$d" ]] && { stop_daemon "$1"; return 0; }
    done
    die "unknown daemon '$1': one of slurmdbd slurmctld slurmrestd ${NODES[*]}"
}

main() {
    [[ $# -ge 2 ]] || { echo "usage: $0 {up|down|status|stop DAEMON|build} CLUSTER" >&2; exit 2; }
    local command=$1 daemon=""
    if [[ $command == stop ]]; then
        daemon=$2
        shift
    fi
    configure_cluster "$2"
    [[ $(id -u) -eq 0 ]] || die "must run as root"
    case $command in
        up) cmd_up ;;
        down) cmd_down ;;
        status) cmd_status ;;
        stop) cmd_stop "$daemon" ;;
        build) build_chroot ;;
        *) echo "usage: $0 {up|down|status|stop DAEMON|build} CLUSTER" >&2; exit 2 ;;
    esac
}

main "$@"
