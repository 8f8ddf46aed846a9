"""A one-node Slurm cluster on this machine, for tests: a munge key made for it, a
slurm.conf written for it (its own ports, state directories, prolog and epilog), munged,
slurmctld and slurmd started as subprocesses and stopped by PID. Nothing of the host's
Slurm or munge (if any) is read or touched: every daemon and client gets the files and
sockets of this cluster only (SLURM_CONF, AuthInfo=socket=...)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol")


def available() -> str | None:
    """Why a cluster cannot be started here (None: it can)."""
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        return (f"slurm-wlm/munge not installed (no {', '.join(missing)}; scripts/setup.sh "
                "installs them)")
    if os.geteuid() != 0:
        return "slurmd runs jobs as their users, so it must run as root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    root: Path
    prolog: str
    epilog: str
    task_prolog: str
    prolog_timeout: int
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "etc/slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client needs to talk to this cluster (and nothing else)."""
        return {"SLURM_CONF": str(self.conf)}

    def write(self) -> None:
        r = self.root
        for d in ("etc", "munge", "ctld", "spool", "log", "run"):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r, 0o755)
        os.chmod(r / "munge", 0o755)   # the socket's directory: every user's client uses it
        key = r / "etc/munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        host = socket.gethostname().split(".")[0]
        cpus = os.cpu_count() or 1
        self.node = host
        lines = [
            "ClusterName=bstest",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={r}/munge/munge.socket",
            f"StateSaveLocation={r}/ctld",
            f"SlurmdSpoolDir={r}/spool",
            f"SlurmctldPidFile={r}/run/slurmctld.pid",
            f"SlurmdPidFile={r}/run/slurmd.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd.log",
            "SlurmdDebug=debug",
            # no cgroups: the processes of a job are tracked by process group
            "ProctrackType=proctrack/pgid",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/builtin",
            "ReturnToService=2",
            "MinJobAge=300",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "KillWait=2",
            f"Prolog={self.prolog}",
            f"Epilog={self.epilog}",
            f"TaskProlog={self.task_prolog}",
            "PrologFlags=Alloc",
            f"PrologEpilogTimeout={self.prolog_timeout}",
            f"NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def _start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        with open(self.root / "log" / f"{name}.out", "ab") as log:
            self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, env=env,
                                                start_new_session=True)

    def start(self) -> None:
        r = self.root
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **self.env}
        self._start("munged", ["munged", "-F", "--force", f"--socket={r}/munge/munge.socket",
                               f"--key-file={r}/etc/munge.key", f"--pid-file={r}/run/munged.pid",
                               f"--log-file={r}/log/munged.log",
                               f"--seed-file={r}/munge/munged.seed"], base)
        self._wait(lambda: (r / "munge/munge.socket").exists(), "munged's socket")
        self._start("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)], base)
        self._start("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.node],
                    base)
        self._wait(lambda: self.node_state() in ("IDLE",), "the node to be idle", 60)

    def _wait(self, ready, what: str, limit: float = 20) -> None:
        deadline = time.time() + limit
        while time.time() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited ({p.returncode}) while waiting for "
                                       f"{what}:\n{self.logs()}")
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"timed out waiting for {what}:\n{self.logs()}")

    def logs(self) -> str:
        out = []
        for f in sorted((self.root / "log").iterdir()):
            out.append(f"--- {f.name}\n" + f.read_text(errors="replace")[-3000:])
        return "\n".join(out)

    def scontrol(self, *args: str) -> str:
        r = subprocess.run(["scontrol", *args], check=False, capture_output=True, text=True,
                           timeout=20, env={**os.environ, **self.env})
        return r.stdout + r.stderr

    def node_state(self) -> str:
        """The node's state as scontrol shows it (IDLE, DRAIN, IDLE+DRAIN, ALLOCATED...)."""
        out = self.scontrol("show", "node", self.node)
        for word in out.split():
            if word.startswith("State="):
                return word[len("State="):]
        return "?"

    def job(self, job_id: str) -> dict[str, str]:
        out = self.scontrol("show", "job", "-o", job_id)
        fields = {}
        for word in out.split():
            k, _, v = word.partition("=")
            fields[k] = v
        return fields

    def wait_job(self, job_id: str, limit: float = 60) -> dict[str, str]:
        """Wait until the job has ended (and its epilog ran); its fields."""
        deadline = time.time() + limit
        while time.time() < deadline:
            fields = self.job(job_id)
            if fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                          "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY") \
                    and "COMPLETING" not in self.node_state():
                return fields
            time.sleep(0.3)
        raise RuntimeError(f"job {job_id} did not end: {self.job(job_id)}\n{self.logs()}")

    def stop(self) -> None:
        """Stop the daemons by their PIDs (slurmd first: it ends its jobs' steps)."""
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.procs.pop(name, None)
            if p is None or p.poll() is not None:
                continue
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
