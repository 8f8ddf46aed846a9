"""The bridge network of separate hosts (bootseer.testing.netns) and the removal of what a
killed run left: only namespaces of our prefix whose creating process is gone."""

from __future__ import annotations

import subprocess
import sys
import time

from bootseer.testing.netns import Network, processes_in, remove_leftovers


def _reach(src, dst_addr: str, port: int) -> bool:
    probe = f"import socket; socket.create_connection(('{dst_addr}', {port}), timeout=3)"
    return subprocess.run([*src.enter(), sys.executable, "-c", probe],
                          capture_output=True).returncode == 0


def test_hosts_reach_each_other_on_the_bridge_and_everything_goes_with_the_network(need_root):
    with Network("bstest") as net:
        a, b = net.add_host("a"), net.add_host("b", egress_rate="100mbit")
        assert a.addr != b.addr
        server = subprocess.Popen([*b.enter(), sys.executable, "-m", "http.server", "8123",
                                   "--bind", b.addr], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not _reach(a, b.addr, 8123):
            assert time.monotonic() < deadline, "a cannot reach b on the bridge"
            time.sleep(0.2)
        qdisc = subprocess.run(["tc", "-n", b.netns, "qdisc", "show", "dev", "eth0"],
                               capture_output=True, text=True).stdout
        assert "tbf" in qdisc and "100Mbit" in qdisc
        names = [net.switch, a.netns, b.netns]
    assert server.wait(10) is not None   # killed with its namespace
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in listed for n in names)


def test_leftovers_of_a_dead_run_are_removed_and_nothing_else(need_root):
    dead = subprocess.Popen(["true"])
    dead.wait()
    ours_dead, ours_live, other = (f"bstest{dead.pid}-x", "bstest1-y", f"bstestx{dead.pid}-z")
    made = []
    try:
        for name in (ours_dead, ours_live, other):
            subprocess.run(["ip", "netns", "add", name], check=True)
            made.append(name)
        sleeper = subprocess.Popen(["nsenter", f"--net=/run/netns/{ours_dead}", "sleep", "300"])
        deadline = time.monotonic() + 5
        while not processes_in(ours_dead):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        removed = remove_leftovers("bstest")
        assert ours_dead in removed and ours_live not in removed   # pid 1 is alive: kept
        assert sleeper.wait(10) is not None
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert ours_dead not in listed and ours_live in listed and other in listed
    finally:
        for name in made:
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
