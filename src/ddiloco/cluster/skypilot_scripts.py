"""The `run:` scripts of the SkyPilot tasks (bash), and the run's own TLS certificate authority.

SkyPilot runs a task's `run:` with its variables set ($SKYPILOT_NODE_IPS, $SKYPILOT_TASK_ID, ...)
and ours from `envs:`/`secrets:`; these scripts read nothing else, so a test can run them as they
are on this machine. The synchronizer script keeps each shard alive inside the task (a process that
dies is restarted from its checkpoint on the same port, as the Slurm job does) and publishes its
address on the store only once the shard listens; SIGTERM (sky cancel, sky down) stops every shard
the clean way (checkpoint, summary), with no restart.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

OPENSSL_TIMEOUT = 60.0

_HEAD = """set -uo pipefail
: "${DDILOCO_TOKEN:?the auth token comes as a SkyPilot secret: --secret DDILOCO_TOKEN}"
"""

_SYNC = """HOST="$DDILOCO_ADVERTISE"
if [ "$HOST" = auto ]; then
    if [ "$DDILOCO_PUBLIC" = 1 ]; then  # ddiloco run finds the public address, then: sky exec --env
        echo "synchronizer node ready; waiting for sky exec --env DDILOCO_ADVERTISE=<its public address>" >&2
        exit 0
    fi
    HOST="$(echo "${SKYPILOT_NODE_IPS:-127.0.0.1}" | head -n1)"
fi
STATE="${DDILOCO_STATE/#\\~/$HOME}"
mkdir -p "$STATE" && chmod 700 "$STATE"
TLS=()
if [ -n "$DDILOCO_TLS" ]; then  # a server certificate for the address we publish, signed by the run's CA
    case "$HOST" in *[!0-9.]*) SAN="DNS:$HOST" ;; *) SAN="IP:$HOST" ;; esac
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=ddiloco-synchronizer \\
        -keyout "$STATE/server.key" -out "$STATE/server.csr" 2>/dev/null || exit 1
    printf 'subjectAltName=%s\\nbasicConstraints=critical,CA:FALSE\\nkeyUsage=critical,digitalSignature\\n%s\\n%s\\n' \\
        "$SAN" extendedKeyUsage=serverAuth authorityKeyIdentifier=keyid >"$STATE/server.ext"
    openssl x509 -req -in "$STATE/server.csr" -CA "$DDILOCO_TLS/ca.pem" -CAkey "$DDILOCO_TLS/ca.key" \\
        -set_serial "0x$(openssl rand -hex 8)" -days 60 -extfile "$STATE/server.ext" -out "$STATE/server.pem" \\
        2>/dev/null || exit 1
    chmod 600 "$STATE/server.key"
    TLS=(--tls-cert "$STATE/server.pem" --tls-key "$STATE/server.key")
fi
echo "synchronizer task ${SKYPILOT_TASK_ID:-} on $(hostname) publishes $HOST at $(date +%T)" >&2

shard() {  # shard S PORT: run it, publish its address once it listens, restart it when it dies
    local s=$1 port=$2 stopping=0 pid=0 rc=0 published="$DDILOCO_RUN/sync-$1/address"
    trap 'stopping=1; [ "$pid" != 0 ] && kill -TERM "$pid" 2>/dev/null' TERM INT
    for attempt in $(seq 0 "$MAX_RESTARTS"); do
        rm -f "$STATE/address-$s" "$published.finished"
        start_shard "$s" &
        pid=$!
        for _ in $(seq 1200); do  # bounded: 10 minutes to listen
            [ -s "$STATE/address-$s" ] && break
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.5
        done
        if [ -s "$STATE/address-$s" ] && [ "$(cat "$published" 2>/dev/null)" != "$HOST:$port" ]; then
            printf '%s:%s\\n' "$HOST" "$port" >"$published.tmp-$$" && mv -f "$published.tmp-$$" "$published"
        fi
        wait "$pid"; rc=$?
        while kill -0 "$pid" 2>/dev/null; do wait "$pid"; rc=$?; done  # a trapped signal interrupts wait
        if [ "$rc" = 0 ] && [ -s "$STATE/address-$s.finished" ]; then  # the run's end, for learners (wire.runend)
            cp -f "$STATE/address-$s.finished" "$published.finished.tmp-$$" && mv -f "$published.finished.tmp-$$" \\
                "$published.finished"
        fi
        [ "$stopping" = 1 ] && return "$rc"
        [ "$rc" = 0 ] && return 0
        echo "synchronizer shard $s exited with $rc; restart $((attempt + 1)) from its checkpoint on port $port" >&2
    done
    return "$rc"
}
"""

_SYNC_TAIL = """PIDS=()
for s in "${!PORTS[@]}"; do
    mkdir -p "$DDILOCO_RUN/sync-$s" || exit 1
    shard "$s" "${PORTS[$s]}" >>"$DDILOCO_RUN/sync-$s/task.log" 2>&1 &
    PIDS+=($!)
done
trap 'kill -TERM "${PIDS[@]}" 2>/dev/null' TERM INT
status=0
for pid in "${PIDS[@]}"; do
    wait "$pid"; rc=$?
    while kill -0 "$pid" 2>/dev/null; do wait "$pid"; rc=$?; done  # a trapped signal interrupts wait
    [ "$rc" != 0 ] && status=$rc
done
exit "$status"
"""


def synchronizer(commands: list[str], ports: list[int], max_restarts: int) -> str:
    """The synchronizer task's script: every shard of `commands` (one per shard, on `ports`)."""
    cases = "\n".join(f"        {s}) exec {command} ;;" for s, command in enumerate(commands))
    start = f'start_shard() {{\n    case "$1" in\n{cases}\n    esac\n}}\n'
    ports_line = f"PORTS=({' '.join(str(p) for p in ports)})\nMAX_RESTARTS={max_restarts}\n"
    return _HEAD + ports_line + _SYNC + start + _SYNC_TAIL


def learner(m: int, files: list[str], command: str, address_wait: int) -> str:
    """A learner's script: wait for the published addresses, then become the learner (exec), so that
    SkyPilot's SIGTERM on a preemption reaches it directly and it sends its work within its grace."""
    return (
        _HEAD
        + f'mkdir -p "$DDILOCO_RUN/learner-{m}"\n'
        + f'echo "learner {m} task ${{SKYPILOT_TASK_ID:-}} starts on $(hostname) at $(date +%T)" >&2\n'
        + f"for f in {' '.join(files)}; do\n"
        + f'    for _ in $(seq {address_wait}); do [ -s "$f" ] && break; sleep 1; done\n'
        + '    [ -s "$f" ] || { echo "no synchronizer address in $f" >&2; exit 1; }\n'
        + "done\n"
        # a learner that ended without its synchronizer (exit 3, `learner.ending`) is not started again:
        # job_recovery would otherwise restart it up to --max-restarts times; 0 ends the managed job
        + f'if [ -s "$DDILOCO_RUN/learner-{m}/ended.json" ]; then\n'
        + f'    echo "learner {m} ended without its synchronizer: not started again" >&2; exit 0\n'
        + "fi\n"
        + f"exec {command}\n"
    )


def _openssl(*args: str) -> None:
    try:
        done = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=OPENSSL_TIMEOUT)
    except FileNotFoundError:
        raise ValueError("TLS needs the openssl command here (to make the run's CA); or use --no-tls") from None
    if done.returncode != 0:
        raise ValueError(f"openssl {args[0]} failed: {done.stderr.strip()[-500:]}")


def make_ca(out: Path) -> tuple[Path, Path]:
    """The run's CA, made once: (folder with ca.pem + ca.key, mode 0700, for the synchronizer task;
    folder with ca.pem only, for the learners). A restarted launcher keeps the CA it made."""
    key_dir, cert_dir = out / "tls", out / "tls-ca"
    for d in (key_dir, cert_dir):
        d.mkdir(parents=True, exist_ok=True)
    key_dir.chmod(0o700)
    if not (key_dir / "ca.pem").is_file() or not (key_dir / "ca.key").is_file():
        _openssl(
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "60",
            "-subj",
            f"/CN=ddiloco run {out.parent.name} CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            str(key_dir / "ca.key"),
            "-out",
            str(key_dir / "ca.pem"),
        )
        (key_dir / "ca.key").chmod(0o600)
    (cert_dir / "ca.pem").write_bytes((key_dir / "ca.pem").read_bytes())
    return key_dir, cert_dir
