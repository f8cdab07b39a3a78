# What scripts/cluster.sh (Slurm 22.05 on the host) and scripts/slurm-chroot.sh (the newer clusters in chroots)
# share: tracking daemons by pid file, waiting for them, writing configuration files, nodes coming up, and the
# description of a cluster that the demo and the tests read. Sourced, not run.
#
# The sourcing script defines: LOG_TAG (the prefix of every line), WAIT_SECS, NODES (the node names),
# pidfile_of NAME, logfile_of NAME (host paths), daemon_pid NAME (the pid if NAME runs), and slurm COMMAND...
# (runs a Slurm client command against its cluster).

log() { printf '[%s] %s\n' "$LOG_TAG" "$*"; }
die() { printf '[%s] ERROR: %s\n' "$LOG_TAG" "$*" >&2; exit 1; }

# Print the end of a log to stderr: every failure message points at the daemon's own words.
show_log() {
    local f=$1
    if [[ -f $f ]]; then
        printf '[%s] --- last lines of %s ---\n' "$LOG_TAG" "$f" >&2
        tail -n 25 "$f" >&2 || true
    fi
}

# A zombie (exited, not yet reaped by init) still has a /proc entry but is not running.
pid_alive() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }  # field 3 (state) follows the parenthesised command name
    [[ ${stat:0:1} != Z ]]
}

is_running() { daemon_pid "$1" >/dev/null; }

# Stop by pid file: TERM, wait (slurmctld saves its state on TERM), KILL as a last resort.
stop_daemon() {
    local name=$1 pid i
    if ! pid=$(daemon_pid "$name"); then
        rm -f "$(pidfile_of "$name")"
        return 0
    fi
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 300; i++)); do
        pid_alive "$pid" || break
        sleep 0.1
    done
    if pid_alive "$pid"; then
        log "$name did not exit after 30s, killing it"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 0.5
    fi
    rm -f "$(pidfile_of "$name")"
}

# wait_for DESCRIPTION LOGFILE COMMAND... : poll COMMAND until it succeeds, at most WAIT_SECS.
wait_for() {
    local what=$1 logf=$2 deadline
    shift 2
    deadline=$((SECONDS + WAIT_SECS))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            printf '[%s] ERROR: timed out after %ss waiting for %s\n' "$LOG_TAG" "$WAIT_SECS" "$what" >&2
            show_log "$logf"
            exit 1
        fi
        sleep 0.5
    done
}

# A daemon that forks itself may still die right after (bad config, port in use): give it a moment.
check_started() {
    local name=$1 i
    for ((i = 0; i < 30; i++)); do
        is_running "$name" && return 0
        sleep 0.2
    done
    printf '[%s] ERROR: %s did not start\n' "$LOG_TAG" "$name" >&2
    show_log "$(logfile_of "$name")"
    exit 1
}

# install_file PATH MODE : write stdin to PATH only when the content differs, so a warm "up" touches nothing.
# Sets CONFIG_CHANGED=1 when it wrote.
CONFIG_CHANGED=0
install_file() {
    local path=$1 mode=$2 tmp
    tmp=$(mktemp "$path.XXXXXX")
    cat >"$tmp"
    chmod "$mode" "$tmp"
    if [[ -f $path ]] && cmp -s "$tmp" "$path"; then
        rm -f "$tmp"
        chmod "$mode" "$path"
        return 0
    fi
    mv "$tmp" "$path"
    CONFIG_CHANGED=1
    log "wrote $path"
}

# One line per node: "gpu01 idle" (sinfo lists a node once per partition, hence sort -u).
node_states() { slurm sinfo -h -N -o '%N %T' | sort -u; }

# All nodes up and usable.  Nodes left DOWN/DRAINED by an earlier run are resumed once their
# slurmd answers (a trailing '*' means "not responding").
nodes_ready() {
    local states ready=0 node state
    states=$(node_states) || return 1
    while read -r node state; do
        [[ -n $node ]] || continue
        case $state in
            idle | mixed | allocated | completing) ready=$((ready + 1)) ;;
            *'*') ;;  # not responding yet: its slurmd has not registered
            down* | drain* | fail* | *drain*)
                slurm scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true
                ;;
        esac
    done <<<"$states"
    ((ready == ${#NODES[@]}))
}

# Prints a root token (SLURM_JWT=<token> stripped); slurmctld signs it with the cluster's JWT key.
root_token() { slurm scontrol token username=root lifespan=60 | sed -n 's/^SLURM_JWT=//p'; }

# registry_write FILE KEY=VALUE... : the cluster's description for the demo and the tests, as JSON (values
# that look like JSON arrays or numbers are written as such, the rest as strings).
registry_write() {
    local file=$1
    shift
    install -d -m 755 "$(dirname "$file")"
    python3 - "$file" "$@" <<'PY'
import json, os, sys
path, pairs = sys.argv[1], sys.argv[2:]
entry = {}
for pair in pairs:
    key, _, value = pair.partition("=")
    if value.startswith("[") or value.isdigit():
        entry[key] = json.loads(value)
    else:
        entry[key] = value
with open(path + ".tmp", "w") as out:
    json.dump(entry, out, indent=2)
    out.write("\n")
os.replace(path + ".tmp", path)
PY
}
