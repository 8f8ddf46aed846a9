"""Zero-code capture: a real torchrun job (4 processes, gloo, checkpoints) and a process
without torch; both through the real interpreter."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer.report import load
from bootseer.report.summary import summarize
from bootseer.report.views import attempts
from bootseer.trace import auto

HERE = Path(__file__).parent


def _env(tmp_path, **kw):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_TRACE_")}
    return {**env, "BOOTSEER_TRACE_LOCATION": str(tmp_path / "trace"),
            "BOOTSEER_TRACE_JOB_ID": "tiny", "OMP_NUM_THREADS": "1", **kw}


@pytest.mark.timeout(240)
def test_torchrun_four_ranks_report_names_phases_and_gating_node(tmp_path):
    (tmp_path / "ckpt").mkdir()
    env = _env(tmp_path, BOOTSEER_TRACE_NODE="n{local_rank}",
               BOOTSEER_READY_FILE=str(tmp_path / "ready"))   # as under `bootseer run`
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nnodes", "1", "--nproc-per-node", "4", "-m", "bootseer.trace.auto",
                        str(HERE / "torch_train.py"), str(tmp_path / "ckpt")],
                       env=env, capture_output=True, text=True, timeout=200)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "ready").exists()   # the first optimizer step said so, no code change
    t = load.load(tmp_path / "trace" / "tiny")
    assert t.skipped_lines == 0
    (v,) = attempts(t.events)
    s = summarize(v)
    assert [n.node for n in v.nodes] == ["n0", "n1", "n2", "n3"]
    for name in ("python.start", "import.torch", "dist.init", "dist.first_collective",
                 "ckpt.load", "train.first_step"):
        assert s.phases[name].n == 4, name
    firsts = [e for e in t.events if e["phase"] == "dist.first_collective"]
    assert {e["attrs"]["op"] for e in firsts} == {"gather_object"}   # dcp.save gathers plans
    assert len([e for e in t.events if e["phase"] == "rendezvous"]) == 4
    assert s.alignment == "rendezvous marks" and s.time_to_ready > 0 and not s.not_ready
    loads = [e for e in t.events if e["phase"] == "ckpt.load"]
    assert len(loads) == 8 and any(e["attrs"].get("bytes", 0) > 0 for e in loads)
    assert {e["rank"] for e in t.events} == {0, 1, 2, 3}
    rep = subprocess.run([sys.executable, "-m", "bootseer", "report",
                          str(tmp_path / "trace" / "tiny")], capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr
    assert s.gating_node in {"n0", "n1", "n2", "n3"} and s.gating_phase in s.phases
    assert f"gated by node {s.gating_node} (rank " in rep.stdout
    assert f"phase {s.gating_phase}" in rep.stdout
    for name in ("dist.init", "ckpt.load", "import.torch", "train.first_step"):
        assert name in rep.stdout


@pytest.mark.timeout(60)
def test_capture_degrades_without_torch(tmp_path):
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "torch.py").write_text("raise ImportError('no torch here')\n")
    script = tmp_path / "s.py"
    script.write_text("try:\n    import torch\nexcept ImportError as e:\n    print('fallback', e)\n"
                      "import colorsys, importlib.machinery as m\n"
                      "assert isinstance(colorsys.__loader__, m.SourceFileLoader)\nprint('done')\n")
    env = _env(tmp_path, PYTHONPATH=str(fake))
    r = subprocess.run([sys.executable, "-m", "bootseer.trace.auto", str(script)], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "fallback no torch here" in r.stdout and "done" in r.stdout, r.stderr
    t = load.load(tmp_path / "trace")
    names = {e["phase"] for e in t.events}
    assert "python.start" in names and "ready" not in names
    failed = [e for e in t.events if e["status"] == "failed"]
    assert [e["phase"] for e in failed] == ["import.torch"]


@pytest.mark.timeout(60)
def test_sitecustomize_hook_and_disabled(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import sys\nsys.exit(3)\n")
    env = _env(tmp_path, BOOTSEER_TRACE_AUTO="1",
               PYTHONPATH=os.pathsep.join([auto.site_dir(), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert r.returncode == 3, r.stderr   # the program's exit status is untouched
    (f,) = (tmp_path / "trace").rglob("*.jsonl")
    assert json.loads(f.read_text().splitlines()[0])["phase"] == "python.start"
    f.unlink()
    env.pop("BOOTSEER_TRACE_LOCATION")   # tracing off: nothing written, nothing fails
    r = subprocess.run([sys.executable, "-m", "bootseer.trace.auto", str(script)], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 3 and not list((tmp_path / "trace").rglob("*.jsonl"))


@pytest.mark.timeout(120)
def test_first_collective_timed_once_then_unwrapped(tmp_path):
    """Only the first collective is timed; afterwards torch.distributed's functions are its
    own again (no wrapper on the training loop's collectives)."""
    script = tmp_path / "c.py"
    script.write_text(
        "import os, torch, torch.distributed as dist\n"
        "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=os.environ['PORT'])\n"
        "dist.init_process_group('gloo', rank=0, world_size=1)\n"
        "assert getattr(dist.all_reduce, '_bootseer', False)\n"
        "dist.all_reduce(torch.ones(2))\n"
        "from torch.distributed import distributed_c10d as c\n"
        "assert dist.all_reduce is c.all_reduce and dist.barrier is c.barrier\n"
        "dist.barrier()\n"
        "dist.destroy_process_group()\n")
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([sys.executable, "-m", "bootseer.trace.auto", str(script)],
                       env=_env(tmp_path, PORT=str(port)), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    events = load.load(tmp_path / "trace").events
    firsts = [e for e in events if e["phase"] == "dist.first_collective"]
    assert [e["attrs"]["op"] for e in firsts] == ["all_reduce"]
    assert [e["phase"] for e in events].count("rendezvous") == 1
