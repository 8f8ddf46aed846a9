"""This node's libtorrent session: the job's network only, nothing beyond it.

No DHT, no local service discovery, no UPnP/NAT-PMP, no trackers, TCP only; the session's
IP filter admits the job's announced nodes and nobody else (both ways), and the upload cap
applies to every peer (libtorrent exempts private networks from rate limits by default, and
a job's network is usually one). A peer that sends data failing its v2 piece hash is banned
by libtorrent; the ban is noted here and the address blocked for the node's lifetime.

One thread pumps the session's alerts: bans are applied, pieces that passed their hash and
pieces read back are queued per torrent (so several sets can move at once in one process,
and a set's transfer wakes on them instead of asking libtorrent for the state of every
piece), and a call from an address the filter does not know yet (a node that joined after
this one read the roster) is noted as a knock: the share then reads the roster once and
calls the newcomer back. Nobody polls.
"""

from __future__ import annotations

import atexit
import ipaddress
import logging
import queue
import socket
import threading
import time

import libtorrent as lt

log = logging.getLogger(__name__)

_ALERTS = (lt.alert.category_t.error_notification | lt.alert.category_t.peer_notification
           | lt.alert.category_t.status_notification | lt.alert.category_t.storage_notification
           | lt.alert.category_t.connect_notification
           | lt.alert.category_t.ip_block_notification
           | lt.alert.category_t.piece_progress_notification)
_ALL_V4 = ("0.0.0.0", "255.255.255.255")
KNOCK_REPEAT_S = 2.0
BLOCKED = 1
# the events of a torrent's queue (``Swarm.events``): (kind, piece, bytes or None)
PIECE_DONE = "done"   # the piece passed its hash (from a peer, or added here)
PIECE_READ = "read"   # the piece read back (``read_piece``): its bytes, None on a read error


def free_port(ip: str, port_min: int, port_max: int) -> int:
    """The first port of the range that ``ip`` can listen on (TCP)."""
    for port in range(port_min, port_max + 1):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((ip, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port in {port_min}-{port_max} on {ip}")


class Swarm:
    """One libtorrent session bound to ``ip``; thread-safe for the calls below."""

    def __init__(self, ip: str, *, port_min: int = 6881, port_max: int = 6999,
                 upload_cap: int = 0):
        ipaddress.IPv4Address(ip)   # a device name is resolved by the caller
        self.ip = ip
        self.port = free_port(ip, port_min, port_max)
        self._lock = threading.Lock()
        self.members: set[str] = set()
        self._endpoints: set[tuple[str, int]] = set()
        self.banned: set[str] = set()
        self.hash_failures = 0
        self.knocked = threading.Event()   # an unknown address called: read the roster
        self.knockers: dict[str, float] = {}   # ip -> when its knock was last heeded
        self._knocks: set[str] = set()   # addresses that knocked since take_knocks()
        self.unreachable: dict[str, float] = {}   # ip -> when a call to it last failed
        self.hung_up: dict[str, float] = {}       # ip -> when a connection with it last ended
        self._events: dict[str, queue.SimpleQueue] = {}   # torrent name -> piece events
        self._closed = threading.Event()
        self.session = lt.session({
            "listen_interfaces": f"{ip}:{self.port}", "outgoing_interfaces": ip,
            "enable_dht": False, "enable_lsd": False, "enable_upnp": False,
            "enable_natpmp": False, "enable_outgoing_utp": False,
            "enable_incoming_utp": False, "upload_rate_limit": upload_cap,
            "alert_mask": _ALERTS, "user_agent": "bootseer", "tick_interval": 100,
            "min_reconnect_time": 0, "connection_speed": 200,
        })
        # Every IPv4 peer in the global class: the cap holds on private networks too.
        classes = lt.ip_filter()
        classes.add_rule(*_ALL_V4, 1 << lt.session.global_peer_class_id)
        self.session.set_peer_class_filter(classes)
        self._apply_filter()
        self._pump_thread = threading.Thread(target=self._pump, daemon=True,
                                             name="bootseer-peers-alerts")
        self._pump_thread.start()
        # a thread still inside libtorrent when the interpreter ends aborts the process
        atexit.register(self._stop_pump)

    @property
    def addr(self) -> str:
        return f"{self.ip}:{self.port}"

    def _apply_filter(self) -> None:
        f = lt.ip_filter()
        f.add_rule(*_ALL_V4, BLOCKED)
        for ip in self.members - self.banned:
            f.add_rule(ip, ip, 0)
        self.session.set_ip_filter(f)

    def admit(self, addrs) -> list[tuple[str, int]]:
        """Let the job's nodes at ``addrs`` (``ip:port``) in; returns the new ones."""
        new = []
        with self._lock:
            for addr in addrs:
                ip, _, port = addr.rpartition(":")
                ep = (ip, int(port))
                if ep == (self.ip, self.port) or ep in self._endpoints:
                    continue
                self._endpoints.add(ep)
                self.members.add(ip)
                new.append(ep)
            if new:
                self._apply_filter()
        return new

    def endpoints(self) -> list[tuple[str, int]]:
        """Every admitted node not banned."""
        with self._lock:
            return sorted(ep for ep in self._endpoints if ep[0] not in self.banned)

    def add(self, ti: lt.torrent_info, save_path: str, *, seed: bool = False):
        """Add a torrent; its pieces' events arrive on ``events(ti)``."""
        self.events(ti)
        params = lt.add_torrent_params()
        params.ti, params.save_path = ti, save_path
        params.flags = (lt.torrent_flags.disable_dht | lt.torrent_flags.disable_lsd
                        | lt.torrent_flags.apply_ip_filter)
        if seed:
            params.flags |= lt.torrent_flags.seed_mode
        return self.session.add_torrent(params)

    def _knock(self, ip: str) -> None:
        """A call from ``ip``, refused by the filter: a node the roster did not list when
        this one read it, or a stranger (who is not let to make the roster be read more
        than once every ``KNOCK_REPEAT_S``)."""
        now = time.monotonic()
        with self._lock:
            if (ip in self.banned or ip in self.members or ip == self.ip
                    or now - self.knockers.get(ip, -KNOCK_REPEAT_S) < KNOCK_REPEAT_S):
                return
            self.knockers[ip] = now
            self._knocks.add(ip)
        self.knocked.set()

    def take_knocks(self) -> set[str]:
        """The addresses that knocked since the last call, less those admitted meanwhile
        (a node whose call was refused just before this one read the roster)."""
        with self._lock:
            knocks, self._knocks = self._knocks - self.members, set()
        return knocks

    def ban(self, ip: str, why: str) -> None:
        """Block ``ip`` for this node's lifetime (the IP filter drops its connections)."""
        with self._lock:
            if ip in self.banned:
                return
            self.banned.add(ip)
            self._apply_filter()
        log.warning("peers: banned %s: %s", ip, why)

    def check_peers(self, peers) -> None:
        """Ban every peer (of ``handle.get_peer_info()``) that took part in a piece that
        failed its hash. libtorrent bans by its own rules too, but may first ask for block
        hashes and take seconds; a peer that shared a failed piece with a liar is banned
        with it (it only costs its bytes, which the origin then serves)."""
        for p in peers:
            if p.num_hashfails > 0:
                self.ban(p.ip[0], f"sent data that failed its piece hash ({p.num_hashfails})")

    def events(self, ti: lt.torrent_info) -> queue.SimpleQueue:
        """``(PIECE_DONE, piece, None)`` and ``(PIECE_READ, piece, bytes or None)`` of
        ``ti``'s pieces; the set's transfer puts its own wake-ups there too."""
        with self._lock:
            return self._events.setdefault(ti.name(), queue.SimpleQueue())

    def _stop_pump(self) -> None:
        self._closed.set()
        self._pump_thread.join(timeout=1.0)

    def _pump(self) -> None:
        while not self._closed.is_set():
            try:
                if self.session.wait_for_alert(200) is not None:
                    self._note(self.session.pop_alerts())
            except Exception as e:  # noqa: BLE001 - a bad alert must not stop the pump
                log.info("peers: alert pump: %s", e)

    def _note(self, alerts) -> None:
        """Act on alerts: bans blocked, piece events queued, knocks noted."""
        for a in alerts:
            if isinstance(a, lt.piece_finished_alert):
                q = self._events.get(a.torrent_name)
                if q is not None:
                    q.put((PIECE_DONE, a.piece_index, None))
            elif isinstance(a, lt.read_piece_alert):
                q = self._events.get(a.torrent_name)
                if q is not None:
                    q.put((PIECE_READ, a.piece, None if a.error.value() else bytes(a.buffer)))
            elif isinstance(a, lt.peer_blocked_alert):
                self._knock(a.ip[0] if isinstance(a.ip, tuple) else str(a.ip))
            elif isinstance(a, lt.peer_ban_alert):
                self.ban(a.endpoint[0], "libtorrent banned it (corrupt pieces)")
            elif isinstance(a, lt.hash_failed_alert):
                self.hash_failures += 1
            elif isinstance(a, (lt.peer_disconnected_alert, lt.peer_error_alert)):
                # a call that never connected: nobody listens there, or a firewall (a node
                # that has not admitted this one yet accepts, then hangs up: not this)
                if a.op == lt.operation_t.connect:
                    self.unreachable[a.ip[0]] = time.monotonic()
                else:   # it answered, then hung up: its filter does not know this node yet
                    self.hung_up[a.ip[0]] = time.monotonic()
                log.debug("peers: %s", a.message())
            elif isinstance(a, lt.listen_failed_alert):
                log.warning("peers: %s", a.message())

    def close(self) -> None:
        """Stop serving and drop every connection (the session object may outlive this)."""
        self._stop_pump()
        self.session.pause()
        for h in self.session.get_torrents():
            self.session.remove_torrent(h)
        deadline = time.monotonic() + 2
        while self.session.get_torrents() and time.monotonic() < deadline:
            time.sleep(0.02)
        self.session.apply_settings({"listen_interfaces": ""})
