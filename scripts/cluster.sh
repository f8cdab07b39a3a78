#!/usr/bin/env bash
# Run the local GPU Slurm clusters on this machine: cluster.sh {up|down|status|stop DAEMON [CLUSTER]}
#
#   local   Slurm 22.05 from this host's packages (below)                         slurmrestd 127.0.0.1:6820
#   north   Slurm 24.11 from Debian 13 in a chroot (scripts/slurm-chroot.sh)       slurmrestd 127.0.0.1:6920
#   south   Slurm 26.05 from Debian unstable in a chroot (scripts/slurm-chroot.sh) slurmrestd 127.0.0.1:7020
# LOCAL_CLUSTERS="local north" brings up (and down stops) only some of them. A newer cluster whose chroot cannot be built (no
# Debian package registry) is reported and skipped: the others still come up. Each cluster that is up is
# described in /var/lib/gpuportal/clusters/NAME.json, which the demo and the tests read.
#
# The 22.05 cluster ("local": 4 fake-GPU nodes, slurmdbd, slurmrestd):
# Layout (all on loopback; see /work/shared/SLURM-NOTES.md for why each piece looks the way it does):
#   munged                      as user munge, key /etc/munge/munge.key
#   slurmdbd   127.0.0.1:6819   MariaDB 127.0.0.1:3306, database slurm_acct_db, user slurm
#   slurmctld  :6817            cluster "local", SlurmUser=root
#   slurmd x4  :17001-17004     gpu01/gpu02 (4x h100 each), gpu03/gpu04 (8x a100 each)
#   network    topology/tree    leaf1: gpu01 gpu02, leaf2: gpu03 gpu04, one spine above both (topology.conf)
#   slurmrestd 127.0.0.1:6820   as user slurmrestd, JWT auth (key /etc/slurm/jwt_hs256.key)
# There is no systemd here, so daemons are started directly and tracked by their pid files.
set -euo pipefail

CLUSTER=local
HOST=$(hostname -s)

CONF_DIR=/etc/slurm
SLURM_CONF=$CONF_DIR/slurm.conf
GRES_CONF=$CONF_DIR/gres.conf
TOPOLOGY_CONF=$CONF_DIR/topology.conf
DBD_CONF=$CONF_DIR/slurmdbd.conf
JWT_KEY=$CONF_DIR/jwt_hs256.key
MUNGE_KEY=/etc/munge/munge.key

STATE_ROOT=/var/lib/gpuportal/slurm
CTLD_STATE=$STATE_ROOT/ctld        # StateSaveLocation
SPOOL_ROOT=$STATE_ROOT/spool       # SlurmdSpoolDir=$SPOOL_ROOT/%n
GPU_DEV_DIR=$STATE_ROOT/dev        # fake /dev/nvidia* files for gres.conf
MUNGE_OURS=$STATE_ROOT/started-munged  # present when this script started munged
RUN_DIR=/run/slurm
LOG_DIR=/var/log/slurm
JOB_LOG_ROOT=/srv/gpuportal/logs   # the "shared filesystem" where jobs write their output

REST_ADDR=127.0.0.1:6820
REST_USER=slurmrestd
REST_PLUGINS=openapi/v0.0.38,openapi/dbv0.0.38
DB_NAME=slurm_acct_db
DB_USER=slurm
DB_PASS=slurm-dev-password  # dev-only; MariaDB listens on loopback only

NODES=(gpu01 gpu02 gpu03 gpu04)
# Leaf switches (topology.conf) and their nodes; the h100 and a100 partitions each sit under one leaf.
SWITCHES=("leaf1=gpu[01-02]" "leaf2=gpu[03-04]")
SWITCH_MAP='{"leaf1": ["gpu01", "gpu02"], "leaf2": ["gpu03", "gpu04"]}'
DEMO_USERS=(alice bob carol dana)  # dana: the demo OpenID provider's newcomer (README, "The demo")
# slurm-wlm-jwt-plugin is only a Recommends, but auth/jwt and rest_auth/jwt live in it;
# curl (readiness check) and procps (pgrep) are missing from minimal Debian images.
PACKAGES=(munge slurm-client slurmctld slurmd slurmdbd slurmrestd slurm-wlm-jwt-plugin curl procps)
WAIT_SECS=${CLUSTER_WAIT_SECS:-60}
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REGISTRY_DIR=${GPUPORTAL_CLUSTER_REGISTRY:-/var/lib/gpuportal/clusters}
read -r -a CLUSTERS <<<"${LOCAL_CLUSTERS:-local north south}"
NEWER_CLUSTERS=()
for _c in "${CLUSTERS[@]}"; do
    case $_c in
        local) ;;
        north | south) NEWER_CLUSTERS+=("$_c") ;;
        *) printf '[cluster] ERROR: unknown cluster %s in LOCAL_CLUSTERS (known: local north south)\n' "$_c" >&2; exit 2 ;;
    esac
done
wants_local() { [[ " ${CLUSTERS[*]} " == *" local "* ]]; }

LOG_TAG=cluster
# Slurm's client commands run on the host itself for this cluster.
slurm() { "$@"; }
# shellcheck source=scripts/lib/slurm-daemons.sh
source "$SCRIPT_DIR/lib/slurm-daemons.sh"

# --- process tracking -----------------------------------------------------------------------------
pidfile_of() {
    case $1 in
        munged) echo /run/munge/munged.pid ;;
        slurmdbd) echo "$RUN_DIR/slurmdbd.pid" ;;
        slurmctld) echo "$RUN_DIR/slurmctld.pid" ;;
        slurmrestd) echo "$RUN_DIR/slurmrestd.pid" ;;
        gpu*) echo "$RUN_DIR/slurmd-$1.pid" ;;
    esac
}

logfile_of() {
    case $1 in
        munged) echo /var/log/munge/munged.log ;;
        gpu*) echo "$LOG_DIR/slurmd-$1.log" ;;
        *) echo "$LOG_DIR/$1.log" ;;
    esac
}

binary_of() { case $1 in gpu*) echo slurmd ;; *) echo "$1" ;; esac; }

# Prints the pid if the pid file names a live process of the right program.  A pid file left
# behind by a crash (or a reused pid) does not count, so "up" after a crash just starts again.
daemon_pid() {
    local pf pid comm
    pf=$(pidfile_of "$1")
    [[ -r $pf ]] || return 1
    pid=$(tr -dc '0-9' <"$pf")
    [[ -n $pid ]] || return 1
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
    [[ $comm == "$(binary_of "$1")" ]] || return 1
    pid_alive "$pid" || return 1
    echo "$pid"
}

# --- installation & one-time setup -----------------------------------------------------------------
ensure_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
    done
    ((${#missing[@]} == 0)) && return 0
    log "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

ensure_users() {
    # slurmrestd refuses to run as root (or as SlurmUser), so it gets its own system account.
    id -u "$REST_USER" >/dev/null 2>&1 || useradd -M -r -s /usr/sbin/nologin -U "$REST_USER"
    # Jobs run as the POSIX user named in the token, so the demo users must exist on the "nodes".
    local u
    for u in "${DEMO_USERS[@]}"; do
        id -u "$u" >/dev/null 2>&1 || { useradd -m -s /bin/bash -U "$u" && log "created user $u"; }
    done
}

ensure_dirs() {
    install -d -m 755 "$CONF_DIR" "$RUN_DIR" "$STATE_ROOT" "$SPOOL_ROOT" "$GPU_DEV_DIR"
    install -d -m 700 "$CTLD_STATE"
    install -d -m 755 "$LOG_DIR"
    local n
    for n in "${NODES[@]}"; do install -d -m 755 "$SPOOL_ROOT/$n"; done
    # gres.conf needs File= entries that exist, otherwise nodes register 0 GPUs and get drained.
    # A plain file works but makes every slurmd log "is not a valid character or block device";
    # a character device with NVIDIA's major number (195) keeps the logs clean.  Nothing opens
    # them (TaskPlugin=task/none constrains no devices), so fall back to a plain file where
    # mknod is not allowed.
    local i f
    for i in 0 1 2 3 4 5 6 7; do
        f=$GPU_DEV_DIR/nvidia$i
        [[ -c $f ]] && continue
        rm -f "$f"
        mknod -m 666 "$f" c 195 "$i" 2>/dev/null || touch "$f"
    done
    # Per-job subdirectories are created later by the portal, as the job's user.
    install -d -o root -g root -m 755 "$JOB_LOG_ROOT"
    # munged checks these are owned by munge and not writable by others.
    install -d -o munge -g munge -m 755 /run/munge
    install -d -o munge -g munge -m 700 /var/lib/munge
    install -d -o munge -g munge -m 700 /var/log/munge
    # slurmrestd writes its own log (start-stop-daemon opens it after dropping privileges).
    touch "$LOG_DIR/slurmrestd.log"
    chown "$REST_USER:$REST_USER" "$LOG_DIR/slurmrestd.log"
}

ensure_keys() {
    if [[ ! -s $MUNGE_KEY ]]; then
        log "creating munge key $MUNGE_KEY"
        install -d -o munge -g munge -m 700 /etc/munge
        mungekey --create --keyfile="$MUNGE_KEY"
    fi
    chown munge:munge "$MUNGE_KEY"
    chmod 400 "$MUNGE_KEY"
    # Created once and kept: tokens minted by the portal's credential holder stay valid across restarts.
    # Whoever holds this key can act as any Slurm user, root included.
    if [[ ! -s $JWT_KEY ]]; then
        log "creating JWT key $JWT_KEY"
        (umask 077 && head -c 32 /dev/urandom >"$JWT_KEY.tmp" && mv "$JWT_KEY.tmp" "$JWT_KEY")
    fi
    chown root:root "$JWT_KEY"
    chmod 600 "$JWT_KEY"
}

# --- configuration ---------------------------------------------------------------------------------
write_configs() {
    install_file "$SLURM_CONF" 644 <<EOF
# Generated by scripts/cluster.sh -- edits are overwritten on the next "cluster.sh up".
# A one-machine dev GPU cluster: 4 slurmd processes on loopback pretend to be 4 GPU nodes.
ClusterName=$CLUSTER
SlurmctldHost=$HOST(127.0.0.1)
# Root everywhere keeps a dev cluster simple (no slurm-owned state/spool dirs to keep in sync).
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817

AuthType=auth/munge
CredType=cred/munge
# JWT for slurmrestd and the portal's tokens; the same key is configured in slurmdbd.conf.
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$JWT_KEY

StateSaveLocation=$CTLD_STATE
SlurmdSpoolDir=$SPOOL_ROOT/%n
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$RUN_DIR/slurmd-%n.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info

# No cgroups here: track processes through /proc and do no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
LaunchType=launch/slurm
MailProg=/bin/true

# Cores and memory are consumable so that many small jobs share a node; a job that does not ask
# for memory gets DefMemPerCPU per CPU instead of the whole node.
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
GresTypes=gpu
# The nodes claim more CPUs/memory than this machine has: trust slurm.conf, not the hardware.
SlurmdParameters=config_overrides
# Nodes left DOWN by an earlier run come back as soon as their slurmd registers.
ReturnToService=2

# Accounting through slurmdbd; GPU TRES must be tracked from the start for GPU-minute quotas.
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819
AccountingStorageTRES=gres/gpu,gres/gpu:h100,gres/gpu:a100
AccountingStorageEnforce=associations,limits,qos,safe
# The portal uses job.comment as its idempotency tag; keep it in the accounting records too.
AccountingStoreFlags=job_comment
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
JobCompType=jobcomp/none

# Usage never decays or resets, so GrpTRESMins works as a hard GPU-minute budget.
PriorityType=priority/multifactor
PriorityDecayHalfLife=0
PriorityUsageResetPeriod=NONE

# Reject jobs that can never run in their partition (time, size) at submit time instead of
# leaving them pending forever.
EnforcePartLimits=ALL
MaxJobCount=10000
MinJobAge=300
KillWait=5
InactiveLimit=0
# Jobs should start right after submission: by default batch jobs may wait up to 3 s
# (batch_sched_delay) for a scheduling pass.  sched_min_interval (us) caps the scheduler at
# 20 passes/s so a burst of submissions does not turn into a burst of scheduling passes.
SchedulerParameters=batch_sched_delay=0,sched_min_interval=50000,sched_interval=5,bf_interval=5

# The network (topology.conf): gpu01-02 under leaf switch leaf1, gpu03-04 under leaf2, both leaves under one
# spine. --switches=1 then asks for nodes under one leaf. slurmrestd does not show the topology before
# Slurm 25.05, so each node also carries its leaf switch as the feature switch-<name>, which is what the
# portal reads (README, "Multi-node jobs").
TopologyPlugin=topology/tree

# gpu01-04 are all this host; each slurmd listens on its own port.
NodeName=gpu[01-02] NodeHostname=$HOST NodeAddr=127.0.0.1 Port=[17001-17002] Sockets=2 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=32000 Gres=gpu:h100:4 Features=switch-leaf1 State=UNKNOWN
NodeName=gpu[03-04] NodeHostname=$HOST NodeAddr=127.0.0.1 Port=[17003-17004] Sockets=2 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=32000 Gres=gpu:a100:8 Features=switch-leaf2 State=UNKNOWN

PartitionName=debug Nodes=gpu[01-04] Default=YES DefaultTime=00:10:00 MaxTime=30 State=UP
PartitionName=h100 Nodes=gpu[01-02] DefaultTime=01:00:00 MaxTime=2-00:00:00 State=UP
PartitionName=a100 Nodes=gpu[03-04] DefaultTime=01:00:00 MaxTime=2-00:00:00 State=UP
EOF

    # The device files only need to exist; with task/none nothing is actually constrained.
    install_file "$GRES_CONF" 644 <<EOF
# Generated by scripts/cluster.sh -- fake GPUs for the dev cluster.
NodeName=gpu[01-02] Name=gpu Type=h100 File=$GPU_DEV_DIR/nvidia[0-3]
NodeName=gpu[03-04] Name=gpu Type=a100 File=$GPU_DEV_DIR/nvidia[0-7]
EOF

    # Read from the directory of slurm.conf (TopologyPlugin=topology/tree above); the same leaves as the features.
    install_file "$TOPOLOGY_CONF" 644 < <(topology_conf "${SWITCHES[@]}")

    # slurmdbd reads only /etc/slurm/slurmdbd.conf and insists on mode 600 owned by its SlurmUser.
    install_file "$DBD_CONF" 600 <<EOF
# Generated by scripts/cluster.sh -- accounting daemon for the dev cluster.
AuthType=auth/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$JWT_KEY
DbdHost=$HOST
DbdAddr=127.0.0.1
DbdPort=6819
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
    chown root:root "$DBD_CONF"
}

ensure_database() {
    # MariaDB itself is services.sh's business (it starts it only if it is not running already).
    bash "$SCRIPT_DIR/services.sh" up mariadb >/dev/null
    # Users for both host spellings: without skip-name-resolve a 127.0.0.1 client is 'localhost'.
    # ALTER keeps the password in sync with slurmdbd.conf if it ever changes.
    mysql -h 127.0.0.1 -u root <<SQL
CREATE DATABASE IF NOT EXISTS $DB_NAME;
CREATE USER IF NOT EXISTS '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
ALTER USER '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
ALTER USER '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL PRIVILEGES ON $DB_NAME.* TO '$DB_USER'@'127.0.0.1';
GRANT ALL PRIVILEGES ON $DB_NAME.* TO '$DB_USER'@'localhost';
SQL
}

# --- daemons ---------------------------------------------------------------------------------------
start_munged() {
    if is_running munged; then
        return 0
    fi
    # Somebody else's munged (e.g. the package's init script) without our pid file: use it.
    if pgrep -x munged >/dev/null && munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
        log "munged already running (not started by this script)"
        return 0
    fi
    log "starting munged"
    rm -f /run/munge/munged.pid
    start-stop-daemon --start --quiet --chuid munge:munge --exec /usr/sbin/munged
    touch "$MUNGE_OURS"
    check_started munged
    wait_for "munge credentials (munge -n | unmunge)" "$(logfile_of munged)" \
        bash -c 'munge -n </dev/null | unmunge'
}

slurmdbd_answers() { timeout 10 sacctmgr -n -P list cluster format=cluster; }

start_slurmdbd() {
    if ! is_running slurmdbd; then
        log "starting slurmdbd"
        # The daemons fork themselves; a non-zero exit here is diagnosed from the log just below.
        slurmdbd || true
        check_started slurmdbd
    fi
    # The first start creates the accounting tables, which takes a few seconds.
    wait_for "slurmdbd to answer sacctmgr" "$(logfile_of slurmdbd)" slurmdbd_answers
    # slurmctld registers with slurmdbd under its ClusterName: the cluster must exist before it starts.
    if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
        log "adding cluster $CLUSTER to the accounting database"
        sacctmgr -i add cluster "$CLUSTER" >/dev/null
    fi
}

slurmctld_answers() { scontrol ping 2>/dev/null | grep -q 'is UP'; }

# slurmctld has forked; did it survive its start-up?  Config and state errors kill it within a
# second or two, before it answers pings; once it answers, it is past them.
slurmctld_survives() {
    local i
    for ((i = 0; i < 50; i++)); do
        sleep 0.2
        is_running slurmctld || return 1
        slurmctld_answers && return 0
    done
}

start_slurmctld() {
    is_running slurmctld && return 0
    local logf log_size
    logf=$(logfile_of slurmctld)
    log_size=$(stat -c %s "$logf" 2>/dev/null || echo 0)
    log "starting slurmctld"
    slurmctld || true
    slurmctld_survives && return 0

    # It died at start-up.  Only this run's part of the log tells why.
    local why
    why=$(tail -c +"$((log_size + 1))" "$logf" 2>/dev/null || true)
    printf '[cluster] slurmctld exited during start-up; its log said:\n%s\n' "$(tail -n 15 <<<"$why")" >&2
    if grep -q 'CLUSTER NAME MISMATCH' <<<"$why"; then
        # State saved under another ClusterName.  slurmctld's own advice is to remove the
        # clustername file; the saved jobs and node states stay usable.
        log "slurmctld state belongs to another ClusterName; removing $CTLD_STATE/clustername and retrying"
        rm -f "$CTLD_STATE/clustername"
    else
        # Any other start-up death is most likely saved state from an incompatible earlier
        # configuration.  This is a dev cluster: park the old state (kept, not deleted) and start
        # clean.  Note job ids then restart at 1, so old ids reappear in sacct.
        local parked
        parked=$CTLD_STATE.broken-$(date +%Y%m%d-%H%M%S)
        log "slurmctld died at start-up; moving its state to $parked and retrying with a clean state"
        mv "$CTLD_STATE" "$parked"
        install -d -m 700 "$CTLD_STATE"
    fi
    slurmctld || true
    slurmctld_survives || { printf '[cluster] ERROR: slurmctld does not start\n' >&2; show_log "$logf"; exit 1; }
}

start_slurmds() {
    local n
    for n in "${NODES[@]}"; do
        if ! is_running "$n"; then
            log "starting slurmd $n"
            slurmd -N "$n" || true
        fi
    done
    for n in "${NODES[@]}"; do check_started "$n"; done
}

start_slurmrestd() {
    is_running slurmrestd && return 0
    log "starting slurmrestd on $REST_ADDR"
    # slurmrestd stays in the foreground: start-stop-daemon detaches it, writes its pid file and
    # drops to the unprivileged user.  SLURM_JWT=daemon: authenticate each request by its token.
    env SLURM_JWT=daemon SLURM_CONF="$SLURM_CONF" \
        start-stop-daemon --start --quiet --background --make-pidfile \
        --pidfile "$(pidfile_of slurmrestd)" --chuid "$REST_USER:$REST_USER" \
        --output "$LOG_DIR/slurmrestd.log" \
        --exec /usr/sbin/slurmrestd -- -a rest_auth/jwt -s "$REST_PLUGINS" "$REST_ADDR"
    check_started slurmrestd
}

# --- readiness -------------------------------------------------------------------------------------
rest_answers() {
    local tok
    tok=$(root_token) || return 1
    [[ -n $tok ]] || return 1
    curl -sf --max-time 5 -H "X-SLURM-USER-NAME: root" -H "X-SLURM-USER-TOKEN: $tok" \
        "http://$REST_ADDR/slurm/v0.0.38/ping" | grep -q '"pings"'
}

summary() {
    cat <<EOF
[cluster] Slurm cluster '$CLUSTER' is up.
  nodes:       gpu01 gpu02 (4x h100 each, partition h100)   gpu03 gpu04 (8x a100 each, partition a100)
  partitions:  debug (default, all nodes, MaxTime=30min), h100 and a100 (MaxTime=2 days)
  network:     leaf switch leaf1 (gpu01 gpu02), leaf2 (gpu03 gpu04), spine above both
  slurmrestd:  http://$REST_ADDR  (openapi v0.0.38 + dbv0.0.38, headers X-SLURM-USER-NAME / X-SLURM-USER-TOKEN)
  JWT key:     $JWT_KEY (HS256; claims sun, iat, exp)
  config:      $SLURM_CONF, $GRES_CONF, $TOPOLOGY_CONF, $DBD_CONF
  logs:        $LOG_DIR/   job output root: $JOB_LOG_ROOT
EOF
    sinfo
}

# What the portal and the tests read to find this cluster (the newer ones write theirs in slurm-chroot.sh).
write_registry() {
    local release
    release=$(slurmctld -V | awk '{print $2}')
    registry_write "$REGISTRY_DIR/$CLUSTER.json" name="$CLUSTER" slurm_cluster_name="$CLUSTER" status=up reason= \
        slurm_generation="${release%.*}" slurm_release="$release" debian_suite=host \
        slurmrestd_url="http://$REST_ADDR" jwt_key_file="$JWT_KEY" admin_user=root log_root="$JOB_LOG_ROOT" \
        gpu_type=h100 gpu_partition=h100 gpus_per_node=4 nodes='["gpu01", "gpu02", "gpu03", "gpu04"]' switches="$SWITCH_MAP" chroot=
}

# --- the newer clusters (each in its chroot) ----------------------------------------------------------
newer_up() {
    ((${#NEWER_CLUSTERS[@]})) || return 0
    local c i rc pids=() unavailable=()
    # Building a chroot takes about a minute, mostly downloads: build the missing ones side by side.
    for c in "${NEWER_CLUSTERS[@]}"; do
        bash "$SCRIPT_DIR/slurm-chroot.sh" build "$c" &
        pids+=($!)
    done
    for i in "${!pids[@]}"; do wait "${pids[$i]}" || true; done
    for c in "${NEWER_CLUSTERS[@]}"; do
        rc=0
        bash "$SCRIPT_DIR/slurm-chroot.sh" up "$c" || rc=$?
        if ((rc == 3)); then
            unavailable+=("$c")
        elif ((rc != 0)); then
            die "cluster $c did not come up (see above)"
        fi
    done
    if ((${#unavailable[@]})); then
        log "WARNING: cluster(s) ${unavailable[*]} unavailable on this machine (see above); the others are up"
    fi
}

# --- commands ---------------------------------------------------------------------------------------
cmd_up() {
    local t0=$SECONDS
    if wants_local; then local_up; else rm -f "$REGISTRY_DIR/$CLUSTER.json"; fi
    newer_up
    log "all clusters up in $((SECONDS - t0))s"
}

local_up() {
    local t0=$SECONDS
    ensure_packages
    ensure_users
    ensure_dirs
    ensure_keys
    write_configs
    if ((CONFIG_CHANGED)) && is_running slurmctld; then
        # slurmctld and the slurmds are started again below; slurmdbd.conf changes need down && up.
        stop_for_new_config
    fi
    ensure_database
    start_munged
    start_slurmdbd
    start_slurmctld
    wait_for "slurmctld to answer (scontrol ping)" "$(logfile_of slurmctld)" slurmctld_answers
    start_slurmds
    start_slurmrestd
    wait_for "all ${#NODES[@]} nodes to be idle in sinfo" "$(logfile_of slurmctld)" nodes_ready
    wait_for "slurmrestd to answer /slurm/v0.0.38/ping" "$(logfile_of slurmrestd)" rest_answers
    write_registry
    log "up in $((SECONDS - t0))s"
    summary
}

cmd_down() {
    local c
    for c in "${NEWER_CLUSTERS[@]}"; do bash "$SCRIPT_DIR/slurm-chroot.sh" down "$c"; done
    if wants_local; then local_down; fi  # LOCAL_CLUSTERS="north" stops north alone, as `up` starts it alone
}

local_down() {
    # Reverse start order: the REST front end first, the accounting daemon (and munge) last.
    stop_daemon slurmrestd
    local n
    for n in "${NODES[@]}"; do stop_daemon "$n"; done
    stop_daemon slurmctld
    stop_daemon slurmdbd
    if [[ -f $MUNGE_OURS ]]; then
        stop_daemon munged
        rm -f "$MUNGE_OURS"
    elif is_running munged; then
        log "munged was not started by this script, leaving it running"
    fi
    log "down (config, keys and state kept for the next 'up')"
}

cmd_status() {
    local c
    printf '== local (Slurm 22.05, host)\n'
    local_status
    for c in "${NEWER_CLUSTERS[@]}"; do
        printf '== %s\n' "$c"
        bash "$SCRIPT_DIR/slurm-chroot.sh" status "$c"
    done
}

local_status() {
    local d pid
    for d in munged slurmdbd slurmctld "${NODES[@]}" slurmrestd; do
        if pid=$(daemon_pid "$d"); then
            printf '%-11s running (pid %s)\n' "$d" "$pid"
        else
            printf '%-11s stopped\n' "$d"
        fi
    done
    if is_running slurmctld; then
        sinfo
    fi
}

# Stop one daemon (tests use it to cause a real outage; `up` starts it again).
cmd_stop() {
    if [[ ${2:-local} != local ]]; then
        bash "$SCRIPT_DIR/slurm-chroot.sh" stop "$1" "$2"
        return
    fi
    case $1 in
        munged | slurmdbd | slurmctld | slurmrestd | gpu0[1-4]) stop_daemon "$1" ;;
        *) die "unknown daemon '$1': one of munged slurmdbd slurmctld slurmrestd ${NODES[*]}" ;;
    esac
}

main() {
    (($# == 1)) || [[ ${1:-} == stop && ($# == 2 || $# == 3) ]] \
        || { echo "usage: $0 {up|down|status|stop DAEMON [CLUSTER]}" >&2; exit 2; }
    case $1 in
        up | down | stop)
            [[ $(id -u) -eq 0 ]] || die "must run as root"
            # One "up"/"down" at a time.  The lock is held by flock(1) around a re-run of this script
            # and closed for the script itself (-o): the daemons it starts must not inherit the lock fd,
            # or they would hold the lock for as long as they live.
            if [[ ${_GPUPORTAL_CLUSTER_LOCKED:-} != 1 ]]; then
                local rc=0
                _GPUPORTAL_CLUSTER_LOCKED=1 flock -o -w 300 -E 75 /run/gpuportal-cluster.lock \
                    bash "${BASH_SOURCE[0]}" "$@" || rc=$?
                ((rc != 75)) || die "another cluster.sh run still holds /run/gpuportal-cluster.lock after 300s"
                exit "$rc"
            fi
            ;;
    esac
    case $1 in
        up) cmd_up ;;
        down) cmd_down ;;
        status) cmd_status ;;
        stop) cmd_stop "$2" "${3:-}" ;;
        *) echo "usage: $0 {up|down|status|stop DAEMON [CLUSTER]}" >&2; exit 2 ;;
    esac
}

main "$@"
