#!/usr/bin/env bash
# SkyPilot's Slurm infra against a Slurm cluster on this machine, for `ddiloco run --backend skypilot`
# end to end without any network: every daemon on 127.0.0.1, nothing fetched but packages from the
# registries (PyPI, Debian). Needs root and Debian 12 (or close).
#
#   bash tools/skypilot_local.sh setup    # install, configure, start Slurm + sshd (idempotent)
#   bash tools/skypilot_local.sh env      # prints the exports to use `sky` against it
#   bash tools/skypilot_local.sh stop     # stops what `setup` started (API server, sshd, Slurm), by PID
#
# What `setup` does, each step skipped when already done:
#   1. apt: rsync, openssh-server, slurmctld/slurmd/slurm-client, munge.
#   2. SkyPilot in a venv of its own ($SKY_VENV, default /tmp/ddiloco-skypilot: it pins click<8.2,
#      which the project's own venv outgrows), with PyPI's `uv` beside it. Two changes to it so that
#      nothing leaves the machine: usage reports off (SKYPILOT_DISABLE_USAGE_COLLECTION=1, for the
#      API server and on the nodes), and the jobs controller's network probe (8.8.8.8, 1.1.1.1)
#      pointed at the API server on 127.0.0.1 (patch_network_probe: offline, without it, a
#      preempted job is never even noticed, let alone recovered).
#   3. The node runtime's two downloads made local. SkyPilot's node setup runs
#      `$HOME/.local/bin/uv -V || curl -LsSf https://astral.sh/uv/install.sh | sh`, with $HOME a fresh
#      per-cluster folder (so a recovered job's new cluster needs uv again), then
#      `uv venv --python 3.10`, which downloads a Python from GitHub when none is found. In $SHIM:
#      a `curl` that answers that one URL with a local installer (copies PyPI's uv) and hands every
#      other call to /usr/bin/curl untouched; Python 3.10 comes from pyenv ($PYENV_VERSION with a
#      3.10) or any python3.10 already on the machine. $SHIM is put first on PATH only in login
#      shells that have DDILOCO_SKY_LOCAL=1, which only our own sshd sets (/etc/profile.d).
#   4. A Slurm cluster of 3 logical nodes (tests/support/slurm_cluster.py) in $SLURM_DIR; its node
#      names (n1..n3) resolve to 127.0.0.1 in /etc/hosts (SkyPilot looks them up).
#   5. An sshd of our own as the cluster's login node: its own config and PID file, ListenAddress
#      127.0.0.1 only, port $SSH_PORT, root by key only (a key made for this, from="127.0.0.1"),
#      SetEnv for the Slurm config, uv's certificates and the markers above. The system sshd and its
#      config are not touched.
#   6. ~/.slurm/config (SkyPilot's list of Slurm clusters, an ssh_config: Host $SKY_CLUSTER) and
#      ~/.sky/config.yaml (only the slurm infra; the jobs controller in the API server:
#      jobs.controller.consolidation_mode, since there is no cloud for a controller VM); both files
#      are overwritten. Then the API server is (re)started, niced, and `sky check slurm` run.
#
# `ddiloco run --backend skypilot --infra slurm/$SKY_CLUSTER --store DIR` then works; on the nodes
# set DDILOCO_SKY_PYTHON to a Python that has ddiloco (the nodes are this machine) and
# DDILOCO_SKY_SETUP=true to skip the install (tests/skypilot/test_sky_e2e.py does).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SKY_VENV="${SKY_VENV:-/tmp/ddiloco-skypilot}"
SLURM_DIR="${SLURM_DIR:-/tmp/ddiloco-sky-slurm}"
SHIM="${SHIM:-/opt/ddiloco-sky}"
SSH_PORT="${SSH_PORT:-2299}"
SKY_API_PORT="${SKY_API_PORT:-46580}" # SkyPilot's local API server (its default port)
SKY_CLUSTER="${SKY_CLUSTER:-ddiloco-local}"
ENV_FILE="${ENV_FILE:-/tmp/ddiloco-sky-local.env}"
SSHD_DIR=/etc/ssh/ddiloco-sky
SSHD_PID=/run/ddiloco-sky-sshd.pid
KEY="$HOME/.ssh/ddiloco-sky"
HOSTS_MARK="# ddiloco-sky: the local Slurm nodes (tools/skypilot_local.sh)"
NODES=(n1 n2 n3)

say() { printf '[skypilot_local] %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

need_root() { [ "$(id -u)" = 0 ] || die "run as root (slurmd starts jobs as their users; sshd, /etc/hosts)"; }

install_apt() {
    local missing=()
    command -v rsync >/dev/null || missing+=(rsync)
    [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
    [ -x /usr/sbin/slurmctld ] || missing+=(slurmctld)
    [ -x /usr/sbin/slurmd ] || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    [ -x /usr/sbin/munged ] || missing+=(munge)
    if [ "${#missing[@]}" -gt 0 ]; then
        say "apt-get install ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

install_skypilot() {
    if ! "$SKY_VENV/bin/python" -c 'import sky, sky.adaptors.slurm' 2>/dev/null; then
        say "SkyPilot into $SKY_VENV"
        python3 -m venv "$SKY_VENV"
        "$SKY_VENV/bin/pip" install -q 'skypilot[slurm]>=0.14'
    fi
    [ -x "$SKY_VENV/bin/uv" ] || "$SKY_VENV/bin/pip" install -q uv
    patch_network_probe
}

# The managed-jobs controller checks "is the network up?" before every status poll of its job, with
# a HEAD to https://8.8.8.8 and https://1.1.1.1 (sky/backends/backend_utils.py: _TEST_IP_LIST, used
# by the monitor loop in sky/jobs/controller.py). Offline both fail, the controller logs "Network is
# not available. Retrying again in 15 seconds." forever and never looks at its job again: a
# preempted (scancel'ed) learner is never recovered, and a connection to a public address is tried
# every 15 s. Point the probe at the API server on loopback instead (in consolidation mode the
# controller runs beside it, so it answers whenever the controller can work). SkyPilot's venv only.
patch_network_probe() {
    "$SKY_VENV/bin/python" - "$SKY_API_PORT" <<'PYEOF'
import pathlib, re, sys
import sky.backends.backend_utils as bu
path = pathlib.Path(bu.__file__)
text = path.read_text()
new = f"_TEST_IP_LIST = ['http://127.0.0.1:{sys.argv[1]}']  # patched by ddiloco tools/skypilot_local.sh"
if new not in text:
    if "_TEST_IP_LIST = ['https://8.8.8.8', 'https://1.1.1.1']" not in text and "127.0.0.1" not in text:
        sys.exit(f"{path}: _TEST_IP_LIST not as in SkyPilot 0.14.1; check the controller's network probe by hand")
    text = re.sub(r"^_TEST_IP_LIST = .*$", new, text, count=1, flags=re.M)
    path.write_text(text)
    for cached in path.parent.glob("__pycache__/backend_utils.*.pyc"):
        cached.unlink()
    print(f"patched {path}: the controller's network probe now asks http://127.0.0.1:{sys.argv[1]}", file=sys.stderr)
PYEOF
}

find_python310() {  # prints a pyenv version name "3.10.x", or a path to a python3.10, or nothing
    local v
    if command -v pyenv >/dev/null; then
        v="$(pyenv versions --bare 2>/dev/null | grep -E '^3\.10\.[0-9]+$' | tail -n1 || true)"
        [ -n "$v" ] && { echo "pyenv:$v"; return; }
    fi
    for p in /usr/bin/python3.10 /usr/local/bin/python3.10; do
        [ -x "$p" ] && { echo "$p"; return; }
    done
}

install_shims() {
    mkdir -p "$SHIM/bin"
    install -m 0755 "$SKY_VENV/bin/uv" "$SHIM/uv"
    cat >"$SHIM/uv-install.sh" <<EOF
#!/bin/sh
# Stands in for https://astral.sh/uv/install.sh: copies PyPI's uv (no download).
set -e
dir="\${UV_INSTALL_DIR:-\$HOME/.local/bin}"
mkdir -p "\$dir"
cp "$SHIM/uv" "\$dir/uv.tmp.\$\$" && mv -f "\$dir/uv.tmp.\$\$" "\$dir/uv"
echo "uv installed from $SHIM/uv into \$dir"
EOF
    cat >"$SHIM/bin/curl" <<EOF
#!/bin/sh
# SkyPilot's node setup fetches uv's installer; answer that one URL locally, pass the rest on.
for a in "\$@"; do
    [ "\$a" = https://astral.sh/uv/install.sh ] && exec cat "$SHIM/uv-install.sh"
done
exec /usr/bin/curl "\$@"
EOF
    chmod 0755 "$SHIM/bin/curl" "$SHIM/uv-install.sh"
    local py
    py="$(find_python310)"
    case "$py" in
        pyenv:*) PYENV_LIST="$(pyenv version-name 2>/dev/null | tr -d '\n'):${py#pyenv:}" ;;
        /*) ln -sf "$py" "$SHIM/bin/python3.10"; PYENV_LIST="" ;;
        *) die "no Python 3.10 here (SkyPilot's node runtime wants one and would download it from GitHub):
    pyenv install 3.10, or a python3.10 in /usr/bin" ;;
    esac
    cat >/etc/profile.d/ddiloco-sky.sh <<EOF
# tools/skypilot_local.sh: only for sessions of its own sshd (DDILOCO_SKY_LOCAL=1), a no-op elsewhere.
if [ -n "\${DDILOCO_SKY_LOCAL:-}" ]; then
    PATH="$SHIM/bin:\$PATH"
    export PATH
fi
EOF
}

configure_hosts() {
    local missing=()
    for n in "${NODES[@]}"; do
        # read /etc/hosts itself: never ask a resolver beyond this machine
        grep -Eq "^127\.0\.0\.1[[:space:]]([^#]*[[:space:]])?$n([[:space:]]|\$)" /etc/hosts || missing+=("$n")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        say "/etc/hosts: ${missing[*]} -> 127.0.0.1"
        printf '%s\n127.0.0.1 %s\n' "$HOSTS_MARK" "${missing[*]}" >>/etc/hosts
    fi
}

start_slurm() {
    if [ -f "$SLURM_DIR/pids.json" ] && SLURM_CONF="$SLURM_DIR/slurm.conf" sinfo -h >/dev/null 2>&1; then
        return
    fi
    say "Slurm cluster in $SLURM_DIR"
    mkdir -p "$SLURM_DIR"
    # 3 nodes of 4 CPUs each (logical: slurmd may claim more than the host has), memory to spare
    python3 - "$REPO" "$SLURM_DIR" <<'EOF'
import sys
from pathlib import Path
sys.path.insert(0, str(Path(sys.argv[1]) / "tests" / "support"))
import slurm_cluster
slurm_cluster.start(Path(sys.argv[2]), nodes=3, cpus=4)
EOF
}

configure_sshd() {
    mkdir -p "$HOME/.ssh" "$SSHD_DIR" /run/sshd
    chmod 700 "$HOME/.ssh"
    [ -f "$KEY" ] || ssh-keygen -q -t ed25519 -N '' -C ddiloco-sky-local -f "$KEY"
    local pub
    pub="from=\"127.0.0.1\" $(cat "$KEY.pub")"
    touch "$SSHD_DIR/authorized_keys"
    grep -qxF "$pub" "$SSHD_DIR/authorized_keys" || echo "$pub" >>"$SSHD_DIR/authorized_keys"
    chmod 600 "$SSHD_DIR/authorized_keys"
    local env_line="SetEnv DDILOCO_SKY_LOCAL=1 SLURM_CONF=$SLURM_DIR/slurm.conf UV_SYSTEM_CERTS=1"
    env_line+=" SKYPILOT_DISABLE_USAGE_COLLECTION=1"  # SkyPilot's usage reports go to its servers otherwise
    env_line+=" SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"
    [ -n "$PYENV_LIST" ] && env_line+=" PYENV_VERSION=$PYENV_LIST"
    cat >"$SSHD_DIR/sshd_config" <<EOF
# tools/skypilot_local.sh: the local Slurm cluster's login node, loopback only.
ListenAddress 127.0.0.1
Port $SSH_PORT
PidFile $SSHD_PID
HostKey /etc/ssh/ssh_host_ed25519_key
AuthorizedKeysFile $SSHD_DIR/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
X11Forwarding no
AllowTcpForwarding local
MaxStartups 100:30:200
MaxSessions 100
$env_line
Subsystem sftp /usr/lib/openssh/sftp-server
EOF
    [ -f /etc/ssh/ssh_host_ed25519_key ] || ssh-keygen -q -A
    /usr/sbin/sshd -t -f "$SSHD_DIR/sshd_config"
    if [ -f "$SSHD_PID" ] && kill -0 "$(cat "$SSHD_PID")" 2>/dev/null; then
        kill -HUP "$(cat "$SSHD_PID")"  # re-read the config
    else
        /usr/sbin/sshd -f "$SSHD_DIR/sshd_config"
    fi
    for _ in $(seq 50); do [ -s "$SSHD_PID" ] && break; sleep 0.1; done
    ssh-keyscan -p "$SSH_PORT" -t ed25519 127.0.0.1 2>/dev/null | sed "s/^127.0.0.1/[127.0.0.1]:$SSH_PORT/" \
        >"$SSHD_DIR/known_hosts"
    ssh -F /dev/null -o BatchMode=yes -o UserKnownHostsFile="$SSHD_DIR/known_hosts" -i "$KEY" -p "$SSH_PORT" \
        root@127.0.0.1 "/bin/bash --login -c 'sinfo -h -o %N && command -v curl | grep -qx $SHIM/bin/curl && python3.10 -V'" \
        >&2 || die "ssh to the login node does not work (see $SSHD_DIR/sshd_config)"
}

configure_sky() {
    mkdir -p "$HOME/.slurm" "$HOME/.sky"
    cat >"$HOME/.slurm/config" <<EOF
# tools/skypilot_local.sh: the local Slurm cluster, its login node our sshd on 127.0.0.1
Host $SKY_CLUSTER
    HostName 127.0.0.1
    Port $SSH_PORT
    User root
    IdentityFile $KEY
    IdentitiesOnly yes
    UserKnownHostsFile $SSHD_DIR/known_hosts
    StrictHostKeyChecking yes
EOF
    chmod 600 "$HOME/.slurm/config"
    cat >"$HOME/.sky/config.yaml" <<EOF
# tools/skypilot_local.sh: only the local Slurm cluster; the managed-jobs controller runs inside
# the API server (no cloud here for a controller VM).
allowed_clouds:
  - slurm
jobs:
  controller:
    consolidation_mode: true
EOF
}

print_env() {
    echo "export DDILOCO_SKY_VENV=$SKY_VENV DDILOCO_SKY_SLURM_DIR=$SLURM_DIR DDILOCO_SKY_SSHD_PID=$SSHD_PID"
    echo "export PATH=$SKY_VENV/bin:\$PATH"
    echo "export SKYPILOT_DISABLE_USAGE_COLLECTION=1  # else sky sends usage reports to its servers"
    echo "export SLURM_CONF=$SLURM_DIR/slurm.conf"
    echo "export DDILOCO_SKY_INFRA=slurm/$SKY_CLUSTER"
}

stop_all() {
    if [ -x "$SKY_VENV/bin/sky" ]; then
        SKYPILOT_DISABLE_USAGE_COLLECTION=1 "$SKY_VENV/bin/sky" api stop >/dev/null 2>&1 || true
    fi
    if [ -f "$SSHD_PID" ]; then
        kill "$(cat "$SSHD_PID")" 2>/dev/null || true
        rm -f "$SSHD_PID"
    fi
    if [ -f "$SLURM_DIR/pids.json" ]; then
        python3 "$REPO/tests/support/slurm_cluster.py" stop "$SLURM_DIR"
    fi
    rm -f "$ENV_FILE"
    say "stopped (left installed: $SKY_VENV, $SHIM, /etc/profile.d/ddiloco-sky.sh, $SSHD_DIR, /etc/hosts lines)"
}

case "${1:-setup}" in
    setup)
        need_root
        install_apt
        install_skypilot
        PYENV_LIST=""
        install_shims
        configure_hosts
        start_slurm
        configure_sshd
        configure_sky
        export SKYPILOT_DISABLE_USAGE_COLLECTION=1
        "$SKY_VENV/bin/sky" api stop >/dev/null 2>&1 || true  # a server started before kept its old config
        nice -n 10 "$SKY_VENV/bin/sky" api start >&2
        "$SKY_VENV/bin/sky" check slurm >&2 || die "sky check slurm failed"
        print_env >"$ENV_FILE"
        say "ready; to use it (also in $ENV_FILE, which tests/skypilot/test_sky_e2e.py reads):"
        print_env
        ;;
    env) print_env ;;
    stop) stop_all ;;
    *) die "usage: $0 [setup|env|stop]" ;;
esac
