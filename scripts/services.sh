#!/usr/bin/env bash
# Ensure the portal's backing services (PostgreSQL, Redis, MariaDB on 127.0.0.1) run: services.sh {up|down|status} [service...]
# `services.sh nginx` installs nginx when it is missing and starts nothing: scripts/portal.sh runs its own.
#
# On the project's dev/CI machines these usually run already; on a plain Debian 12 box they are absent.
# "up" leaves a service alone when its port answers, otherwise installs (if needed) and starts it.
# There is no systemd here, so every daemon is started directly.  Services this script started are
# listed in $STATE_FILE so that "down" stops only those and never something that was running before.
set -euo pipefail

STATE_DIR=/var/lib/gpuportal
STATE_FILE=$STATE_DIR/started-services
LOCK_FILE=/run/gpuportal-services.lock
WAIT_SECS=${SERVICES_WAIT_SECS:-60}
ALL_SERVICES=(postgresql redis mariadb)

log() { printf '[services] %s\n' "$*"; }
die() { printf '[services] ERROR: %s\n' "$*" >&2; exit 1; }

port_of() {
    case $1 in
        postgresql) echo 5432 ;;
        redis) echo 6379 ;;
        mariadb) echo 3306 ;;
        *) die "unknown service '$1' (known: ${ALL_SERVICES[*]})" ;;
    esac
}

package_of() {
    case $1 in
        postgresql) echo postgresql ;;
        redis) echo redis-server ;;
        mariadb) echo mariadb-server ;;
    esac
}

# The log a failed start should be diagnosed from.
logfile_of() {
    case $1 in
        postgresql) echo "/var/log/postgresql/postgresql-$(pg_version)-main.log" ;;
        redis) echo /var/log/redis/ci.log ;;
        mariadb) echo /var/log/mysql/mariadbd.out ;;
    esac
}

# A TCP connect is the one check that means the same thing for all three services.
port_open() {
    timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

wait_port() {  # wait_port SERVICE  -- bounded, so a broken start fails loudly instead of hanging CI
    local svc=$1 port deadline
    port=$(port_of "$svc")
    deadline=$((SECONDS + WAIT_SECS))
    until port_open "$port"; do
        if ((SECONDS >= deadline)); then
            local lf
            lf=$(logfile_of "$svc")
            printf '[services] ERROR: %s did not answer on 127.0.0.1:%s within %ss. Last lines of %s:\n' \
                "$svc" "$port" "$WAIT_SECS" "$lf" >&2
            tail -n 20 "$lf" >&2 2>/dev/null || true
            exit 1
        fi
        sleep 0.5
    done
}

wait_port_closed() {
    local port deadline
    port=$(port_of "$1")
    deadline=$((SECONDS + WAIT_SECS))
    while port_open "$port"; do
        ((SECONDS < deadline)) || die "$1 still answers on 127.0.0.1:$port after ${WAIT_SECS}s"
        sleep 0.5
    done
}

# --- state file: one service name per line ---------------------------------------------------
recorded() { [[ -f $STATE_FILE ]] && grep -qx "$1" "$STATE_FILE"; }
record() { recorded "$1" || echo "$1" >>"$STATE_FILE"; }
unrecord() {
    [[ -f $STATE_FILE ]] || return 0
    local rest
    rest=$(grep -vx "$1" "$STATE_FILE" || true)
    if [[ -n $rest ]]; then printf '%s\n' "$rest" >"$STATE_FILE"; else rm -f "$STATE_FILE"; fi
}

# --- packages ---------------------------------------------------------------------------------
APT_UPDATED=0
ensure_package() {
    local pkg=$1
    if dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed'; then
        return 0
    fi
    # Only touch the package index when something is actually missing: keeps "up" fast and offline-safe.
    if ((APT_UPDATED == 0)); then
        log "apt-get update (package $pkg is missing)"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        APT_UPDATED=1
    fi
    log "installing $pkg"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null
}

# --- PostgreSQL -------------------------------------------------------------------------------
pg_version() {
    # Newest cluster config directory; falls back to the newest installed server binaries.
    local v
    v=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
    [[ -n $v ]] || v=$(ls /usr/lib/postgresql 2>/dev/null | sort -V | tail -n 1)
    echo "$v"
}

start_postgresql() {
    local ver
    ver=$(pg_version)
    [[ -n $ver ]] || die "no PostgreSQL version found under /etc/postgresql or /usr/lib/postgresql"
    # The package normally creates the "main" cluster; create it if an earlier install skipped that.
    if [[ ! -f /etc/postgresql/$ver/main/postgresql.conf ]]; then
        log "creating PostgreSQL cluster $ver/main"
        pg_createcluster "$ver" main >/dev/null
    fi
    # pg_createcluster picks the next free port (5433, ...) when 5432 was busy at install time,
    # but the app expects 5432, and nothing answers there (we checked), so claim it.
    local port
    port=$(pg_conftool -s "$ver" main show port 2>/dev/null || echo 5432)
    if [[ $port != 5432 ]]; then
        # Never reconfigure a cluster somebody is using on its other port.
        if pg_ctlcluster --skip-systemctl-redirect "$ver" main status >/dev/null 2>&1; then
            die "PostgreSQL $ver/main already runs on port $port, not 5432; set DATABASE_URL accordingly or move it to 5432"
        fi
        log "PostgreSQL $ver/main is configured for port $port; switching it to 5432"
        pg_conftool "$ver" main set port 5432
    fi
    # --skip-systemctl-redirect: there is no systemd here, run pg_ctl directly.
    # "status" first: starting a running cluster is an error, and the package may have started it.
    pg_ctlcluster --skip-systemctl-redirect "$ver" main status >/dev/null 2>&1 ||
        pg_ctlcluster --skip-systemctl-redirect "$ver" main start
}

stop_postgresql() {
    local ver
    ver=$(pg_version)
    if pg_ctlcluster --skip-systemctl-redirect "$ver" main status >/dev/null 2>&1; then
        pg_ctlcluster --skip-systemctl-redirect "$ver" main stop
    fi
}

# The app connects as postgres@127.0.0.1 without a password (DATABASE_URL default); Debian's
# default pg_hba wants scram for TCP, so a fresh cluster gets loopback trust lines on top.
fix_postgresql_auth() {
    if psql -h 127.0.0.1 -U postgres -w -Atc 'select 1' >/dev/null 2>&1; then
        return 0
    fi
    local ver hba marker='# gpuportal: passwordless loopback TCP (added by scripts/services.sh)'
    ver=$(pg_version)
    hba=/etc/postgresql/$ver/main/pg_hba.conf
    if ! grep -qF "$marker" "$hba"; then
        log "allowing passwordless loopback connections in $hba"
        # pg_hba is first-match-wins, so the trust lines must come before Debian's scram lines.
        { printf '%s\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n\n' "$marker"; cat "$hba"; } >"$hba.new"
        chown --reference="$hba" "$hba.new"
        chmod --reference="$hba" "$hba.new"
        mv "$hba.new" "$hba"
    fi
    pg_ctlcluster --skip-systemctl-redirect "$ver" main reload
    sleep 1
    psql -h 127.0.0.1 -U postgres -w -Atc 'select 1' >/dev/null ||
        die "postgres@127.0.0.1 still cannot log in without a password; check $hba"
}

# --- Redis --------------------------------------------------------------------------------------
start_redis() {
    install -d -o redis -g redis -m 750 /var/lib/redis
    install -d -o redis -g adm -m 2750 /var/log/redis
    # A throwaway dev cache: no persistence, so nothing is written behind the app's back.
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
        --dir /var/lib/redis --logfile /var/log/redis/ci.log
}

stop_redis() {
    redis-cli -h 127.0.0.1 -p 6379 shutdown nosave >/dev/null 2>&1 || true
}

# --- MariaDB ------------------------------------------------------------------------------------
start_mariadb() {
    # mariadbd puts its socket and pid file in /run/mysqld and runs as mysql: that dir must be mysql's.
    install -d -o mysql -g mysql -m 755 /run/mysqld
    install -d -o mysql -g adm -m 2750 /var/log/mysql
    if [[ ! -d /var/lib/mysql/mysql ]]; then
        log "initialising MariaDB data directory /var/lib/mysql"
        mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/var/log/mysql/install-db.log 2>&1 ||
            die "mariadb-install-db failed, see /var/log/mysql/install-db.log"
    fi
    # mariadbd stays in the foreground; start-stop-daemon detaches it.  --user: it refuses to run as root.
    start-stop-daemon --start --oknodo --background --output /var/log/mysql/mariadbd.out \
        --exec /usr/sbin/mariadbd -- --user=mysql
}

stop_mariadb() {
    start-stop-daemon --stop --oknodo --quiet --exec /usr/sbin/mariadbd --retry TERM/60/KILL/5
}

# Slurm's accounting setup (scripts/cluster.sh) logs in as root over 127.0.0.1 without a password.
# A fresh Debian MariaDB only lets root in through the unix socket, so open the TCP route too.
fix_mariadb_auth() {
    if mysql -h 127.0.0.1 -u root -e 'select 1' >/dev/null 2>&1; then
        return 0
    fi
    log "allowing passwordless root login over 127.0.0.1 in MariaDB"
    # As OS root the socket login (unix_socket plugin) works on a fresh install.
    mysql -u root <<'SQL'
ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('');
CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED VIA mysql_native_password USING PASSWORD('');
CREATE USER IF NOT EXISTS 'root'@'::1' IDENTIFIED VIA mysql_native_password USING PASSWORD('');
GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON *.* TO 'root'@'::1' WITH GRANT OPTION;
FLUSH PRIVILEGES;
SQL
    mysql -h 127.0.0.1 -u root -e 'select 1' >/dev/null || die "root still cannot log in to MariaDB over 127.0.0.1"
}

# --- commands -----------------------------------------------------------------------------------
up_one() {
    local svc=$1 port
    port=$(port_of "$svc")
    if port_open "$port"; then
        log "$svc already answers on 127.0.0.1:$port, leaving it alone"
        return 0
    fi
    ensure_package "$(package_of "$svc")"
    # A package's postinst may already have started the daemon (sysvinit without policy-rc.d).
    # It was not running before this script ran, so it still counts as ours.
    # Record before starting: if the start or the wait fails the daemon may still be half-up,
    # and "down" should clean it up (its stop is a no-op for a service that is not running).
    record "$svc"
    if ! port_open "$port"; then
        log "starting $svc"
        "start_$svc"
    fi
    wait_port "$svc"
    case $svc in
        postgresql) fix_postgresql_auth ;;
        mariadb) fix_mariadb_auth ;;
    esac
    log "$svc is up on 127.0.0.1:$port"
}

down_one() {
    local svc=$1
    if ! recorded "$svc"; then
        log "$svc was not started by this script, leaving it alone"
        return 0
    fi
    # Stop even if the port is closed: a half-started daemon from a failed "up" may still run.
    # The stop functions are no-ops for a stopped service.
    log "stopping $svc"
    "stop_$svc"
    wait_port_closed "$svc"
    unrecord "$svc"
    log "$svc stopped"
}

status_one() {
    local svc=$1 port state origin
    port=$(port_of "$svc")
    if port_open "$port"; then state=up; else state=down; fi
    if recorded "$svc"; then origin='started by services.sh'; else origin='not managed by services.sh'; fi
    printf '%-11s 127.0.0.1:%-5s %-4s (%s)\n' "$svc" "$port" "$state" "$origin"
}

usage() { echo "usage: $0 {up|down|status} [${ALL_SERVICES[*]}] | $0 nginx | $0 iproute2" >&2; exit 2; }

# Debian 12's small build (proxy, static files, WebSocket upgrades: all the portal needs); later releases
# dropped it for plain nginx. A daemon the package's postinst may start serves its default site on port 80 only.
ensure_nginx() {
    [[ -x /usr/sbin/nginx ]] && return 0
    ensure_package nginx-light 2>/dev/null || ensure_package nginx
    [[ -x /usr/sbin/nginx ]] || die "nginx was installed but /usr/sbin/nginx is missing"
}

main() {
    (($# >= 1)) || usage
    local cmd=$1
    shift
    if [[ $cmd == nginx ]]; then
        [[ $(id -u) -eq 0 ]] || die "must run as root to install nginx (or install Debian's nginx-light yourself)"
        ensure_nginx
        return 0
    fi
    # `ip netns` and veth pairs for the multi-host drill (scripts/drills/netns.py); a minimal Debian may lack it.
    if [[ $cmd == iproute2 ]]; then
        command -v ip >/dev/null 2>&1 && return 0
        [[ $(id -u) -eq 0 ]] || die "must run as root to install iproute2"
        ensure_package iproute2
        return 0
    fi
    local services=("$@")
    ((${#services[@]})) || services=("${ALL_SERVICES[@]}")
    local s
    for s in "${services[@]}"; do port_of "$s" >/dev/null; done

    case $cmd in
        status)
            for s in "${services[@]}"; do status_one "$s"; done
            return 0
            ;;
        up | down) ;;
        *) usage ;;
    esac

    [[ $(id -u) -eq 0 ]] || die "must run as root (installs packages and starts system daemons)"
    # Serialise concurrent runs (e.g. cluster.sh calling us while a developer does too).  flock(1)
    # holds the lock around a re-run of this script and closes it for the script itself (-o), so the
    # daemons started below do not inherit the lock fd and keep it locked for as long as they live.
    if [[ ${_GPUPORTAL_SERVICES_LOCKED:-} != 1 ]]; then
        local rc=0
        _GPUPORTAL_SERVICES_LOCKED=1 flock -o -w 300 -E 75 "$LOCK_FILE" bash "${BASH_SOURCE[0]}" "$cmd" "${services[@]}" || rc=$?
        ((rc != 75)) || die "another services.sh run still holds $LOCK_FILE after 300s"
        exit "$rc"
    fi
    mkdir -p "$STATE_DIR"

    if [[ $cmd == up ]]; then
        for s in "${services[@]}"; do up_one "$s"; done
    else
        # Reverse order of "up".
        local i
        for ((i = ${#services[@]} - 1; i >= 0; i--)); do down_one "${services[i]}"; done
    fi
}

main "$@"
