#!/usr/bin/env bash
# Records what Slurm itself sees of a real NVIDIA GPU, which the dev clusters' fake GPUs cannot show: GPU
# autodetection through NVML (gres.conf AutoDetect=nvml: `slurmd -G`, slurmd's log), the device a job is bound
# to (CUDA_VISIBLE_DEVICES, `scontrol show job -d` GRES IDX), the per-step GPU usage TRES gres/gpuutil and
# gres/gpumem (`sstat` while a torch job loads the GPU) and slurmrestd's JSON for that job and the node.
#
# Slurm is Debian sid's (26.05, slurm-wlm-nvml-plugin from contrib) in a chroot packed as .gpucheck/root.tar.xz
# (built beforehand by scripts/gpu-slurm-pack.sh where the Debian mirror answers; no network needed here). The
# device's own libnvidia-ml is copied into the chroot (NVML must match the kernel driver); the job runs torch on
# the device's own root through /host.
# Slurm refuses GRES TRES without slurmdbd, so slurmdbd runs too, on a MariaDB in the chroot (127.0.0.1 only).
# One node, one run, everything in a private mount namespace, cleaned up at the end. Writes 8 files: report.txt,
# job.json, job-after.json (slurmrestd /slurm/.../job while running and after), slurmdb-job.json (/slurmdb/.../job),
# nodes.json, job-output.txt, slurmctld.log, slurmd.log.
# Run as root on a node with NVIDIA GPUs: bash scripts/gpu-slurm-check.sh OUTDIR
# Without a GPU (or GPU_CHECK_FAKE=1) it runs the same steps with a fake GPU device file and a CPU-only job.
# Knobs: GPU_CHECK_ROOT (/tmp/slurmroot), GPU_CHECK_PORT_BASE (7410: slurmctld, +1 slurmd, +2 slurmrestd,
# +3 slurmdbd, +4 MariaDB), GPU_CHECK_TARBALL, GPU_CHECK_LOAD_SECS (30), GPU_CHECK_IDLE_SECS (0: after the load, the
# job holds its GPU memory idle this long). Takes about a minute.
set -uo pipefail
out=${1:?usage: gpu-slurm-check.sh OUTDIR}
[[ $(id -u) -eq 0 ]] || { echo "must run as root" >&2; exit 1; }
# Every mount below lives in a private mount namespace: nothing leaks to the machine, even on a crash.
if [[ -z ${GPU_CHECK_IN_NS:-} ]]; then
    exec unshare --mount --propagation private env GPU_CHECK_IN_NS=1 bash "$0" "$@"
fi
mkdir -p "$out" && out=$(cd "$out" && pwd)
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tarball=${GPU_CHECK_TARBALL:-$repo/.gpucheck/root.tar.xz}
R=${GPU_CHECK_ROOT:-/tmp/slurmroot}
base=${GPU_CHECK_PORT_BASE:-7410}
ctld_port=$base slurmd_port=$((base + 1)) rest_addr=127.0.0.1:$((base + 2)) dbd_port=$((base + 3)) db_port=$((base + 4))
load_secs=${GPU_CHECK_LOAD_SECS:-30}
idle_secs=${GPU_CHECK_IDLE_SECS:-0} # then the job holds its GPU memory this long, computing nothing
node=gpunode
report=$out/report.txt
t0=$SECONDS
host_py=$(command -v python3 || echo /usr/bin/python3)
summary=()
pids=()

: >"$report"
sec() { printf '\n## %s  [t=%ss]\n' "$*" "$((SECONDS - t0))" >>"$report"; echo "[gpu-slurm-check t=$((SECONDS - t0))s] $*" >&2; }
note() { printf '%s\n' "$*" >>"$report"; }
fail() { note "ERROR: $*"; summary+=("ERROR: $*"); }
# A command inside the chroot, never for more than 30 s.
in_root() { timeout 30 chroot "$R" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin SLURM_CONF=/etc/slurm/slurm.conf "$@"; }
# rec CMD... : the command, its output and exit status into the report (never stops the script).
rec() {
    note "\$ $*"
    "$@" >>"$report" 2>&1
    local rc=$?
    ((rc == 0)) || note "(exit status $rc)"
    return $rc
}
slurm() { rec in_root "$@"; }

# --- clean-up: daemons by pid, anything left running in the chroot, then the mounts ----------------------
pid_alive() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; [[ ${s:0:1} != Z ]]; }
cleanup() {
    local p i
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for ((i = 0; i < 50; i++)); do
        local alive=0
        for p in "${pids[@]}"; do pid_alive "$p" && alive=1; done
        ((alive)) || break
        sleep 0.2
    done
    for p in "${pids[@]}"; do pid_alive "$p" && kill -KILL "$p" 2>/dev/null; done
    for p in /proc/[0-9]*; do
        case $(readlink "$p/root" 2>/dev/null) in "$R" | "$R"/*) kill -KILL "${p#/proc/}" 2>/dev/null ;; esac
    done
    sleep 0.3
    local m
    for m in host dev sys proc run; do
        mountpoint -q "$R/$m" 2>/dev/null && { umount -R "$R/$m" 2>/dev/null || umount -R -l "$R/$m"; }
    done
    # Remove the unpacked tree only once /host is provably not the machine's root any more.
    if [[ -d $R ]] && ! findmnt -rn -o TARGET | grep -q "^$R\(/\|$\)" && rmdir "$R/host" 2>/dev/null; then
        rm -rf --one-file-system "$R"
    fi
}
trap cleanup EXIT

# --- the chroot -----------------------------------------------------------------------------------------
if [[ -e $R ]]; then
    if findmnt -rn -o TARGET | grep -q "^$R\(/\|$\)"; then R=$(mktemp -d /tmp/slurmroot.XXXXXX); else rm -rf --one-file-system "$R"; fi
fi
mkdir -p "$R"
sec "machine"
rec uname -a
note "tarball: $tarball ($(stat -c %s "$tarball" 2>/dev/null || echo missing) bytes), chroot: $R, host python: $host_py"
# xz may be missing on a bare machine: then Python's lzma unpacks it.
unxz_to_stdout() {
    if command -v xz >/dev/null; then xz -dc "$1"; else
        "$host_py" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$1"
    fi
}
if ! unxz_to_stdout "$tarball" 2>>"$report" | tar -C "$R" -xf - 2>>"$report"; then
    fail "cannot unpack $tarball"
    exit 1
fi
mkdir -p "$R/host" "$R/proc" "$R/sys" "$R/dev" "$R/run"
mount --rbind / "$R/host" || fail "bind-mounting / at $R/host"
mount --bind /proc "$R/proc" || fail "mounting /proc"
mount --rbind /sys "$R/sys" || fail "mounting /sys"
mount --rbind /dev "$R/dev" || fail "mounting /dev"
mount -t tmpfs -o mode=755,size=64m tmpfs "$R/run" || fail "mounting /run"
rec in_root slurmctld -V

# --- the device's NVIDIA user-space libraries, never Debian's -----------------------------------------------
fake=${GPU_CHECK_FAKE:-0}
gpus=0
smi=$(command -v nvidia-smi || true)
sec "GPUs on the machine"
if [[ $fake != 1 && -n $smi ]] && rec timeout 20 "$smi" -L; then
    gpus=$(timeout 20 "$smi" -L 2>/dev/null | grep -c '^GPU ')
    rec timeout 20 "$smi" --query-gpu=index,uuid,name,pci.bus_id,driver_version,memory.total,mig.mode.current --format=csv
fi
if ((gpus == 0)); then
    fake=1
    note "no GPU found (or GPU_CHECK_FAKE=1): FAKE mode, one fake gpu device file, CPU-only job"
    summary+=("FAKE mode: no NVIDIA GPU used")
fi
libdir=$R/usr/lib/x86_64-linux-gnu
if [[ $fake != 1 ]]; then
    sec "NVIDIA libraries copied into the chroot"
    cp -L "$smi" "$R/usr/bin/nvidia-smi" && note "nvidia-smi: $smi"
    mapfile -t libs < <({
        ldconfig -p | awk '/(libnvidia-ml|libcuda)\.so/ {print $NF}'
        ls /usr/local/nvidia/lib64/libnvidia-ml.so* /usr/local/nvidia/lib64/libcuda.so* \
            /usr/lib/x86_64-linux-gnu/libnvidia-ml.so* /usr/lib/x86_64-linux-gnu/libcuda.so* 2>/dev/null
    } | sort -u)
    for l in "${libs[@]}"; do
        [[ -e $l ]] || continue
        [[ -e $libdir/$(basename "$l") ]] || cp -L "$l" "$libdir/$(basename "$l")"
        note "$l -> $(readlink -f "$l")"
    done
    # Slurm dlopens libnvidia-ml.so (then .so.1); make sure both names exist.
    [[ -e $libdir/libnvidia-ml.so.1 ]] || fail "libnvidia-ml.so.1 not found on the machine"
    [[ -e $libdir/libnvidia-ml.so || ! -e $libdir/libnvidia-ml.so.1 ]] || ln -s libnvidia-ml.so.1 "$libdir/libnvidia-ml.so"
    chroot "$R" ldconfig
    rec in_root sh -c 'ldconfig -p | grep -E "nvidia|cuda"'
    rec in_root nvidia-smi -L
fi

# --- configuration --------------------------------------------------------------------------------------
install -d -m 755 "$R/etc/slurm" "$R/var/log/slurm" "$R/var/lib/slurm/spool" "$R/var/lib/slurm/dev" "$R/run/slurm" \
    "$R/run/mysqld" "$R/var/lib/mysql"
install -d -m 700 "$R/var/lib/slurm/ctld"
for key in slurm.key jwt_hs256.key; do
    (umask 077 && head -c 32 /dev/urandom >"$R/etc/slurm/$key")
done
grep -q '^slurmrestd:' "$R/etc/passwd" || {
    echo 'slurmrestd:x:990:990:slurmrestd:/nonexistent:/usr/sbin/nologin' >>"$R/etc/passwd"
    echo 'slurmrestd:x:990:' >>"$R/etc/group"
}
touch "$R/var/log/slurm/slurmrestd.log" && chown 990:990 "$R/var/log/slurm/slurmrestd.log"
host=$(hostname -s 2>/dev/null || hostname)
printf '127.0.0.1 localhost %s %s\n::1 localhost ip6-localhost\n' "$host" "$node" >"$R/etc/hosts"

sec "slurmd -C (the node's hardware as slurmd sees it)"
hw=$(in_root slurmd -C 2>&1)
note "$hw"
hw_fields=$(grep -o 'CPUs=[0-9]* Boards=[0-9]* SocketsPerBoard=[0-9]* CoresPerSocket=[0-9]* ThreadsPerCore=[0-9]*' <<<"$hw" | head -n 1)
realmem=$(grep -o 'RealMemory=[0-9]*' <<<"$hw" | head -n 1 | cut -d= -f2)
[[ -n $hw_fields ]] || { hw_fields="CPUs=$(nproc)"; fail "slurmd -C gave no CPU layout; using $hw_fields"; }
realmem=$(((${realmem:-4000} * 9) / 10))

if [[ $fake == 1 ]]; then
    gres_node="Gres=gpu:1"
    mknod -m 666 "$R/var/lib/slurm/dev/nvidia0" c 195 0 2>/dev/null || touch "$R/var/lib/slurm/dev/nvidia0"
    gres_conf="# FAKE mode (no GPU here): a device file that merely exists
AutoDetect=off
NodeName=$node Name=gpu File=/var/lib/slurm/dev/nvidia0"
else
    gres_node="Gres=gpu:$gpus"
    gres_conf="AutoDetect=nvml"
fi
cat >"$R/etc/slurm/slurm.conf" <<EOF
# Written by scripts/gpu-slurm-check.sh: one node, the machine's real GPUs found through NVML.
ClusterName=gpucheck
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/slurm
CredType=cred/slurm
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=/etc/slurm/jwt_hs256.key
StateSaveLocation=/var/lib/slurm/ctld
SlurmdSpoolDir=/var/lib/slurm/spool
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldDebug=info
SlurmdDebug=debug
DebugFlags=Gres
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
GresTypes=gpu
ReturnToService=2
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=2
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$dbd_port
AccountingStorageTRES=gres/gpu,gres/gpumem,gres/gpuutil
MinJobAge=600
KillWait=5
InactiveLimit=0
SchedulerParameters=batch_sched_delay=0,sched_min_interval=50000,sched_interval=2
NodeName=$node NodeHostname=$host NodeAddr=127.0.0.1 $hw_fields RealMemory=$realmem $gres_node State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=30 State=UP
EOF
printf '%s\n' "$gres_conf" >"$R/etc/slurm/gres.conf"
printf 'CgroupPlugin=disabled\n' >"$R/etc/slurm/cgroup.conf"
db_pass=$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
cat >"$R/etc/slurm/slurmdbd.conf" <<EOF
AuthType=auth/slurm
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=/etc/slurm/jwt_hs256.key
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$dbd_port
SlurmUser=root
DebugLevel=info
LogFile=/var/log/slurm/slurmdbd.log
PidFile=/run/slurm/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$db_port
StorageUser=slurm
StoragePass=$db_pass
StorageLoc=slurm_acct_db
EOF
chmod 600 "$R/etc/slurm/slurmdbd.conf"
sec "slurm.conf"; cat "$R/etc/slurm/slurm.conf" >>"$report"
sec "gres.conf"; cat "$R/etc/slurm/gres.conf" >>"$report"
sec "cgroup.conf"; cat "$R/etc/slurm/cgroup.conf" >>"$report"

sec "slurmd -G (GRES as slurmd finds it: slurm.conf + gres.conf + NVML autodetection)"
slurm slurmd -N "$node" -G -vv || fail "slurmd -G failed"

# --- daemons --------------------------------------------------------------------------------------------
# start LOGFILE ARGS... : a daemon in the foreground (-D), in the background, its pid remembered.
start() {
    local log=$1
    shift
    chroot "$R" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin SLURM_CONF=/etc/slurm/slurm.conf "$@" \
        >>"$R/var/log/slurm/$log" 2>&1 </dev/null &
    pids+=($!)
}
# wait_until SECONDS DESCRIPTION COMMAND... : poll until COMMAND succeeds; false (and an error) on timeout.
wait_until() {
    local limit=$1 what=$2 deadline
    shift 2
    deadline=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then fail "timed out after ${limit}s waiting for $what"; return 1; fi
        sleep 0.5
    done
    note "($what after $((SECONDS - t0))s)"
}
db_up() { in_root mariadb -S /run/mysqld/mysqld.sock -e 'select 1'; }
dbd_up() { in_root sacctmgr -n -P list cluster format=cluster; }
ctld_up() { in_root scontrol ping | grep -q 'is UP'; }
node_state() { in_root sinfo -h -N -n "$node" -o '%T' 2>/dev/null | head -n 1; }
node_idle() { [[ $(node_state) == idle ]]; }

# MariaDB (root by its unix socket), then slurmdbd over TCP on 127.0.0.1. The database and slurmdbd's user are
# made first: without slurm_acct_db, sid's slurmdbd exits on its first query ("Number of columns in result (=1)
# set execeeds maxmimum allowed number of columns (=0)").
start_accounting() {
    sec "starting MariaDB and slurmdbd"
    rec in_root mariadb-install-db --no-defaults --user=root --datadir=/var/lib/mysql --skip-test-db --force \
        --auth-root-authentication-method=socket >/dev/null || fail "mariadb-install-db failed"
    start mariadb.log mariadbd --no-defaults --user=root --datadir=/var/lib/mysql \
        --socket=/run/mysqld/mysqld.sock --bind-address=127.0.0.1 --port="$db_port" \
        --pid-file=/run/mysqld/mysqld.pid --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900 \
        --innodb-log-file-size=16M \
        --innodb-snapshot-isolation=OFF
    wait_until 30 "MariaDB to answer" db_up || return 1
    rec in_root mariadb -S /run/mysqld/mysqld.sock -e "CREATE DATABASE slurm_acct_db; CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$db_pass';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" || return 1
    start slurmdbd.stderr slurmdbd -D
    wait_until 45 "slurmdbd to answer sacctmgr" dbd_up || return 1
    slurm sacctmgr -i add cluster gpucheck
}

start_cluster() {
    sec "starting slurmctld and slurmd"
    start slurmctld.stderr slurmctld -D -i
    wait_until 30 "slurmctld to answer" ctld_up || return 1
    start slurmd.stderr slurmd -D -N "$node"
    if ! wait_until 30 "node $node to be idle" node_idle; then
        slurm scontrol show node -d "$node"
        slurm scontrol update nodename="$node" state=resume
        wait_until 10 "node $node to be idle after resume" node_idle || return 1
    fi
    slurm scontrol show node -d "$node"
    slurm sinfo -N -o '%N %T %c %m %G'
    slurm sh -c "scontrol show config | grep -iE 'tres|gres|acct|auth|cred|select|proctrack|taskplugin'"
    slurm sacctmgr -n -P list tres
}

# http PATH [OUTFILE] : GET from slurmrestd; prints the HTTP status on stderr; the body goes to OUTFILE (or
# stdout). The machine's own Python: the chroot has no HTTP client.
token=""
http() {
    "$host_py" - "http://$rest_addr$1" "$token" "${2:-/dev/stdout}" <<'PY'
import sys, urllib.request, urllib.error
url, token, dest = sys.argv[1:4]
req = urllib.request.Request(url, headers={"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": token})
try:
    with urllib.request.urlopen(req, timeout=20) as r:
        status, body = r.status, r.read()
except urllib.error.HTTPError as e:
    status, body = e.code, e.read()
except Exception as e:
    status, body = 0, repr(e).encode()
with open(dest, "wb") as f:
    f.write(body)
print(status, file=sys.stderr)
PY
}
rest_up() { http /openapi/v3 /dev/null 2>&1 | grep -q '^200$'; }

# slurmrestd as its own unprivileged user, JWT per request (as scripts/slurm-chroot.sh runs it); sets $api to
# the newest /slurm/v0.0.x it serves.
api=""
start_rest() {
    sec "slurmrestd on $rest_addr"
    start slurmrestd.log env SLURM_JWT=daemon setsid /usr/sbin/slurmrestd -u slurmrestd -g slurmrestd \
        -a rest_auth/jwt "$rest_addr"
    token=$(in_root scontrol token username=root lifespan=900 2>>"$report" | sed -n 's/^SLURM_JWT=//p')
    [[ -n $token ]] || { fail "scontrol token gave no token"; return 1; }
    wait_until 30 "slurmrestd to answer /openapi/v3" rest_up || return 1
    api=$(http /openapi/v3 2>/dev/null | grep -o '/slurm/v0\.0\.[0-9]*/job/' | sort -t. -k3,3n -u | tail -n 1 | cut -d/ -f3)
    if [[ -z $api ]]; then
        local v
        for v in v0.0.46 v0.0.45 v0.0.44 v0.0.43 v0.0.42; do
            http "/slurm/$v/ping" /dev/null 2>&1 | grep -q '^200$' && { api=$v; break; }
        done
    fi
    note "newest slurm API served: ${api:-none found}"
    [[ -n $api ]] || fail "no /slurm/v0.0.x API found on slurmrestd"
}

# --- the job --------------------------------------------------------------------------------------------
cat >"$R/tmp/gpu-job.sh" <<EOF
#!/bin/bash
echo "## job environment (GPU binding)"
env | grep -E 'CUDA|SLURM_JOB_GPUS|GPU_DEVICE_ORDINAL|SLURM_STEP_GPUS|SLURM_GPUS|SLURM_JOB_ID|SLURMD_NODENAME' | sort
echo "## nvidia-smi -L (in the Slurm chroot)"
nvidia-smi -L 2>&1 || echo "(no nvidia-smi)"
echo "## load on the machine's own root (chroot /host), ${load_secs}s"
chroot /host /usr/bin/env PATH="$PATH" LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}" "$host_py" - <<'PY'
import os, time
end = time.time() + $load_secs
print("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"), "pid", os.getpid(), flush=True)
try:
    import torch
    cuda = torch.cuda.is_available()
except Exception as e:
    print("torch import failed:", e, flush=True)
    cuda = False
if cuda:
    print("torch", torch.__version__, "devices", torch.cuda.device_count(), torch.cuda.get_device_name(0), flush=True)
    held = torch.empty(4 * 2**30, dtype=torch.uint8, device="cuda")  # 4 GiB held, so gres/gpumem shows it
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    n = 0
    while time.time() < end:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()
        n += 20
    print("matmuls", n, "max_memory_reserved_MiB", torch.cuda.max_memory_reserved() // 2**20, flush=True)
    if $idle_secs:
        print("idle for", $idle_secs, "s, memory held", flush=True)
        time.sleep($idle_secs)
else:
    print("no CUDA: CPU loop instead", flush=True)
    while time.time() < end:
        sum(range(100000))
PY
echo "## python exit status \$?"
EOF
chmod 755 "$R/tmp/gpu-job.sh"

jobid=""
job_state() { in_root squeue -h -j "$jobid" -o '%T' 2>/dev/null; }
job_running() { [[ $(job_state) == RUNNING ]]; }
job_gone() { local s; s=$(job_state); [[ -z $s || $s == COMPLETED || $s == FAILED || $s == CANCELLED || $s == TIMEOUT ]]; }
batch_done() { in_root sacct -n -P -j "$jobid.batch" -o State | grep -q COMPLETED; }

run_job() {
    sec "sbatch"
    jobid=$(in_root sbatch --parsable --gres=gpu:1 -t 5 -J gpucheck -o /tmp/gpu-job-%j.out /tmp/gpu-job.sh 2>>"$report")
    note "job id: ${jobid:-none}"
    [[ -n $jobid ]] || { fail "sbatch failed"; return 1; }
    wait_until 30 "job $jobid to run" job_running || { slurm scontrol show job -d "$jobid"; return 1; }
    local started=$SECONDS i
    sleep 6
    for i in 1 2 3 4 5; do
        # Samples at about 6, 12, 18, 24, 30 s into the job (torch needs a few seconds to start).
        sec "sstat sample $i (job running $((SECONDS - started))s)"
        slurm sstat -j "$jobid.batch" -a -p --format=JobID,TRESUsageInAve,TRESUsageInMax,TRESUsageInTot
        [[ $fake == 1 ]] || rec timeout 20 "$smi" --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
        [[ $fake == 1 ]] || rec timeout 20 "$smi" --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader
        if ((i == 3)); then
            sec "scontrol show job -d $jobid (running)"
            slurm scontrol show job -d "$jobid"
            slurm scontrol show node -d "$node"
            if [[ -n $api ]]; then
                sec "slurmrestd GET /slurm/$api/job/$jobid and /slurm/$api/nodes (running)"
                note "job: HTTP $(http "/slurm/$api/job/$jobid" "$out/job.json" 2>&1)"
                note "nodes: HTTP $(http "/slurm/$api/nodes" "$out/nodes.json" 2>&1)"
            fi
        fi
        job_running || break
        sleep 5
    done
    sec "after the job"
    wait_until $((load_secs + idle_secs + 60)) "job $jobid to end" job_gone
    slurm scontrol show job -d "$jobid"
    [[ -z $api ]] || note "job: HTTP $(http "/slurm/$api/job/$jobid" "$out/job-after.json" 2>&1)"
    sec "accounting (slurmdbd): sacct and /slurmdb/$api/job/$jobid"
    wait_until 20 "the batch step in the accounting database" batch_done
    slurm sacct -j "$jobid" -p --format=JobID,JobName,State,ExitCode,Elapsed,AllocTRES,TRESUsageInAve,TRESUsageInMax,TRESUsageInTot
    [[ -z $api ]] || note "slurmdb job: HTTP $(http "/slurmdb/$api/job/$jobid" "$out/slurmdb-job.json" 2>&1)"
}

# Each stage needs the one before; a failed stage is recorded and the rest skipped, the logs still collected.
started_ok=0
start_accounting && start_cluster && started_ok=1
sec "slurmd log: GPU / NVML / GRES lines"
grep -iE 'nvml|gpu|gres' "$R/var/log/slurm/slurmd.log" 2>&1 | head -n 120 >>"$report"
if ((started_ok)); then
    start_rest
    run_job
fi
[[ -z $jobid ]] || cp "$R/tmp/gpu-job-$jobid.out" "$out/job-output.txt" 2>/dev/null || fail "no job output file"

# --- logs and summary -----------------------------------------------------------------------------------
sec "daemon stderr"
for f in slurmctld.stderr slurmd.stderr slurmdbd.stderr slurmdbd.log mariadb.log; do note "-- $f"; tail -n 40 "$R/var/log/slurm/$f" >>"$report" 2>&1; done
sec "slurmrestd.log"
tail -n 60 "$R/var/log/slurm/slurmrestd.log" >>"$report" 2>&1
tail -n 3000 "$R/var/log/slurm/slurmctld.log" >"$out/slurmctld.log" 2>&1
tail -n 5000 "$R/var/log/slurm/slurmd.log" >"$out/slurmd.log" 2>&1

sec "summary"
summary+=("slurm: $(in_root slurmctld -V 2>&1)")
summary+=("slurmd -G gpu lines: $(grep -c 'gpu' <<<"$(sed -n '/^## slurmd -G/,/^## starting/p' "$report")")")
summary+=("nvml in slurmd log: $(grep -ciE 'nvml' "$R/var/log/slurm/slurmd.log" 2>/dev/null)")
summary+=("job ${jobid:-none}: $(grep -m1 -o 'JobState=[A-Z_]*' <(sed -n '/^## after the job/,$p' "$report") || echo '?')")
summary+=("job env: $(grep -E '^(CUDA_VISIBLE_DEVICES|SLURM_JOB_GPUS)=' "$out/job-output.txt" 2>/dev/null | tr '\n' ' ')")
summary+=("GRES in show job -d: $(grep -m1 -oE ' GRES=[^ ]*' <(sed -n '/^## scontrol show job -d/,$p' "$report") || echo none)")
summary+=("sstat gres/gpuutil seen: $(grep -c 'gres/gpuutil' <(sed -n '/^## sstat sample/,/^## after/p' "$report"))x, gres/gpumem: $(grep -c 'gres/gpumem' <(sed -n '/^## sstat sample/,/^## after/p' "$report"))x")
summary+=("sacct gres/gpuutil seen: $(sed -n '/^## accounting/,/^## daemon/p' "$report" | grep -c 'gres/gpuutil')x")
summary+=("REST api ${api:-none}; job.json $(stat -c %s "$out/job.json" 2>/dev/null || echo 0) bytes, nodes.json $(stat -c %s "$out/nodes.json" 2>/dev/null || echo 0) bytes")
summary+=("took $((SECONDS - t0))s")
printf '%s\n' "${summary[@]}" | tee -a "$report"
ls -l "$out"
