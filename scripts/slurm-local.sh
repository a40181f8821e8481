#!/usr/bin/env bash
# A localhost-only, single-node Slurm cluster from Debian's packages, for trying and testing
# sweeps on Slurm (`hydra/launcher=slurm`, `slurm_cpu`, `submitit_slurm`) on one machine.
#
#   scripts/slurm-local.sh up        install slurm-wlm + munge if missing (apt-get), start the cluster
#   scripts/slurm-local.sh status    daemons, node, queue, listening sockets
#   scripts/slurm-local.sh env       print the exports that point Slurm's commands at it
#   scripts/slurm-local.sh down      cancel its jobs, stop its daemons (by PID), remove its namespace
#
# Then `source $SPECPOLICY_SLURM_DIR/env.sh` (default /tmp/specpolicy-slurm/env.sh) and use
# sbatch / squeue / sinfo / scancel / srun as usual, e.g.
#   python -m specpolicy -m policy.k=2,4 policy=static hydra/launcher=slurm_cpu
#
# The cluster: munged, slurmctld and slurmd started by this script and stopped by their PIDs;
# a fresh munge key, `slurm.conf` with this host as the only node (its real CPU count and
# memory, from `slurmd -C`), one partition `debug`, no accounting daemon; state, logs and PID
# files under $SPECPOLICY_SLURM_DIR. Nothing listens beyond loopback: slurmctld 22.05 binds
# the wildcard address even with CommunicationParameters=NoInAddrAny (so do srun's I/O
# ports), so every daemon -- and every job, which slurmd starts -- runs in a network
# namespace whose only interface is `lo`; the client commands reach it through wrappers in
# $SPECPOLICY_SLURM_DIR/bin (`nsenter --net`), first on PATH in env.sh. Needs root (slurmd,
# network namespaces), iproute2 and util-linux.
set -euo pipefail

DIR=${SPECPOLICY_SLURM_DIR:-/tmp/specpolicy-slurm}
NS=specpolicy-slurm-$(printf %s "$DIR" | cksum | cut -d' ' -f1)  # one namespace per cluster directory
CONF=$DIR/etc/slurm.conf
CLIENTS="sbatch squeue scancel scontrol sinfo srun salloc sattach sacct sstat sprio sdiag"
DAEMONS="slurmd slurmctld munged"   # stop order

say() { echo "slurm-local: $*"; }
die() { echo "slurm-local: error: $*" >&2; exit 1; }

ns_exists() { ip netns list 2>/dev/null | awk -v ns="$NS" '$1 == ns {found = 1} END {exit !found}'; }

need_root() { [ "$(id -u)" = 0 ] || die "needs root (slurmd runs jobs as their users; network namespaces)"; }

install_packages() {
    local packages=""
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
        || packages="slurm-wlm"
    command -v munged >/dev/null || packages="$packages munge"
    command -v ip >/dev/null && command -v ss >/dev/null || packages="$packages iproute2"
    command -v nsenter >/dev/null || packages="$packages util-linux"
    packages=${packages# }
    [ -n "$packages" ] || return 0
    command -v apt-get >/dev/null || die "needs $packages, and there is no apt-get to install them"
    say "installing $packages (apt-get)"
    # The packages' maintainer scripts must not start system-wide daemons (they would bind
    # every address): policy-rc.d answers 101 ("action not allowed") while they install.
    local guard=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
        guard=/usr/sbin/policy-rc.d
    fi
    local rc=0
    # shellcheck disable=SC2086
    { timeout 600 apt-get update -q && DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -q \
        --no-install-recommends $packages; } >"${TMPDIR:-/tmp}/slurm-local-apt.log" 2>&1 || rc=$?
    [ -z "$guard" ] || rm -f "$guard"
    [ "$rc" = 0 ] || { tail -20 "${TMPDIR:-/tmp}/slurm-local-apt.log" >&2; die "apt-get failed (exit $rc)"; }
}

# pid_of NAME: the PID in NAME's PID file when that process is alive and is NAME, else nothing.
pid_of() {
    local f=$DIR/run/$1.pid pid
    [ -s "$f" ] || return 0
    pid=$(tr -dc 0-9 <"$f")
    [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ] && echo "$pid"
    return 0
}

write_config() {
    # this host as the only node: its real sockets / cores / threads and memory (MB)
    local node
    node=$(slurmd -C | head -1)
    case "$node" in NodeName=*) ;; *) die "slurmd -C gave no node line: $node" ;; esac
    local cpus mem
    cpus=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$node")
    mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node")
    cat >"$CONF" <<EOF
# Written by scripts/slurm-local.sh: a localhost-only single-node cluster.
ClusterName=specpolicy-local
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: also how long a requeued job waits before it may start again (default 120 s)
AuthInfo=socket=$DIR/munge/munge.socket.2,cred_expire=30
StateSaveLocation=$DIR/state/slurmctld
SlurmdSpoolDir=$DIR/state/slurmd
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# no accounting daemon: sacct has nothing to report; squeue keeps finished jobs for MinJobAge s
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=300
# a job without --mem gets its share of memory per CPU, not the whole node
DefMemPerCPU=$((mem / cpus))
ReturnToService=2
MailProg=/bin/true
$node NodeAddr=127.0.0.1 NodeHostname=$(hostname -s) State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

write_wrappers() {
    local ns_id c
    ns_id=$(ip netns exec "$NS" readlink /proc/self/ns/net)
    for c in $CLIENTS; do
        cat >"$DIR/bin/$c" <<EOF
#!/bin/sh
# $c inside the local Slurm's network namespace (scripts/slurm-local.sh); direct when already there
[ "\$(readlink /proc/self/ns/net)" = "$ns_id" ] && exec /usr/bin/$c "\$@"
exec nsenter --net=/run/netns/$NS /usr/bin/$c "\$@"
EOF
        chmod 755 "$DIR/bin/$c"
    done
    cat >"$DIR/env.sh" <<EOF
# source me: Slurm's commands talk to the local cluster of scripts/slurm-local.sh
export SLURM_CONF=$CONF
export PATH=$DIR/bin:\$PATH
EOF
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...: until COMMAND succeeds
    local limit=$1 what=$2
    shift 2
    local end=$((SECONDS + limit))
    while ((SECONDS < end)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    die "$what did not come up within ${limit}s (logs: $DIR/log)"
}

node_idle() { SLURM_CONF=$CONF timeout 10 "$DIR/bin/sinfo" -h -o %T | grep -qx idle; }

# Our daemons listening outside the namespace, or anything but loopback inside it: nothing expected.
check_loopback_only() {
    local d pid bad=""
    for d in $DAEMONS; do
        pid=$(pid_of "$d")
        [ -z "$pid" ] || ! ss -ltnpH | grep -q "pid=$pid," || bad="$bad $d"
    done
    [ -z "$bad" ] || die "listening outside the namespace:$bad"
    [ "$(ip -n "$NS" -o link | awk -F': ' '{print $2}' | tr '\n' ' ')" = "lo " ] \
        || die "the namespace $NS has interfaces other than lo"
}

up() {
    need_root
    install_packages
    if [ -n "$(pid_of slurmctld)" ]; then
        say "already up ($DIR); source $DIR/env.sh"
        return 0
    fi
    if ns_exists && [ -n "$(ip netns pids "$NS")" ]; then
        die "namespace $NS still has processes: scripts/slurm-local.sh down first"
    fi
    trap 'say "up failed: stopping what it started"; down' EXIT
    rm -rf "${DIR:?}/state" "${DIR:?}/run" "${DIR:?}/bin" "${DIR:?}/log"
    mkdir -p "$DIR/etc" "$DIR/state/slurmctld" "$DIR/state/slurmd" "$DIR/log" "$DIR/run" "$DIR/bin" "$DIR/munge"
    chmod 755 "$DIR"
    chmod 755 "$DIR/munge"   # munged: the socket directory must be searchable by all
    # a fresh munge key (munged wants it private to its user)
    rm -f "$DIR/munge/munge.key"
    dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$DIR/munge/munge.key"
    # the network namespace: loopback only
    ns_exists || ip netns add "$NS"
    ip -n "$NS" link set lo up
    # Slurm resolves addresses with AI_ADDRCONFIG, which glibc grants IPv4 only when an address
    # other than 127.0.0.1 exists: a second loopback address (still 127.0.0.0/8, still lo).
    ip -n "$NS" -4 -o addr show dev lo | grep -q ' 127\.0\.0\.2/' || ip -n "$NS" addr add 127.0.0.2/8 dev lo
    write_config
    write_wrappers
    in_ns() { nsenter --net="/run/netns/$NS" "$@"; }  # (ip netns exec would remount /sys: no cgroups)
    in_ns munged --socket="$DIR/munge/munge.socket.2" --key-file="$DIR/munge/munge.key" \
        --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed" \
        || die "munged did not start (log: $DIR/log/munged.log)"
    wait_for 10 munged test -S "$DIR/munge/munge.socket.2"
    in_ns slurmctld -f "$CONF" || die "slurmctld did not start (log: $DIR/log/slurmctld.log)"
    wait_for 30 slurmctld timeout 10 env SLURM_CONF="$CONF" "$DIR/bin/scontrol" ping
    in_ns slurmd -f "$CONF" || die "slurmd did not start (log: $DIR/log/slurmd.log)"
    wait_for 60 "the node (slurmd)" node_idle
    check_loopback_only
    trap - EXIT
    say "up: partition debug, node $(hostname -s) ($(grep -o 'CPUs=[0-9]*' "$CONF"), $(grep -o 'RealMemory=[0-9]*' "$CONF") MB)"
    say "state and logs in $DIR; use it with: source $DIR/env.sh"
}

stop_pid() {  # stop_pid NAME PID: TERM, up to 15 s, then KILL
    local name=$1 pid=$2 i
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < 30; i++)); do
        [ -d "/proc/$pid" ] || { say "stopped $name (pid $pid)"; return 0; }
        sleep 0.5
    done
    kill -KILL "$pid" 2>/dev/null || true
    say "killed $name (pid $pid)"
}

down() {
    need_root
    local d pid jobs i
    if [ -n "$(pid_of slurmctld)" ]; then
        jobs=$(SLURM_CONF=$CONF "$DIR/bin/squeue" -h -o %A 2>/dev/null | sort -u | tr '\n' ' ' || true)
        if [ -n "${jobs// /}" ]; then
            say "cancelling jobs $jobs"
            # shellcheck disable=SC2086
            SLURM_CONF=$CONF "$DIR/bin/scancel" $jobs || true
            for ((i = 0; i < 40; i++)); do
                [ -z "$(SLURM_CONF=$CONF "$DIR/bin/squeue" -h -t active -o %A 2>/dev/null)" ] && break
                sleep 0.5
            done
        fi
    fi
    for d in $DAEMONS; do
        pid=$(pid_of "$d")
        [ -z "$pid" ] || stop_pid "$d" "$pid"
        rm -f "$DIR/run/$d.pid"
    done
    if ns_exists; then
        # what is left in the namespace was started by the daemons above (job steps)
        for pid in $(ip netns pids "$NS"); do stop_pid "$(cat "/proc/$pid/comm" 2>/dev/null)" "$pid"; done
        ip netns delete "$NS"
    fi
    rm -rf "${DIR:?}/bin" "${DIR:?}/env.sh"
    say "down (logs kept in $DIR/log)"
}

status() {
    local d pid
    for d in munged slurmctld slurmd; do
        pid=$(pid_of "$d")
        if [ -n "$pid" ]; then echo "$d: running, pid $pid"; else echo "$d: not running"; fi
    done
    [ -n "$(pid_of slurmctld)" ] || return 0
    echo "--- sinfo"
    SLURM_CONF=$CONF "$DIR/bin/sinfo"
    echo "--- squeue"
    SLURM_CONF=$CONF "$DIR/bin/squeue" -o "%.12i %.9P %.20j %.8T %.10M %R"
    echo "--- listening inside namespace $NS (its only interface: lo)"
    ip netns exec "$NS" ss -ltnp
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    env) if [ -f "$DIR/env.sh" ]; then cat "$DIR/env.sh"; else die "not up ($DIR/env.sh missing)"; fi ;;
    *) echo "usage: $0 up|down|status|env   (state in \$SPECPOLICY_SLURM_DIR, default /tmp/specpolicy-slurm)" >&2; exit 2 ;;
esac
