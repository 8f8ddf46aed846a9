"""This node's address for peer traffic: the one named in the settings, else the one this
node routes to the store from (the job's network, as far as this node can tell)."""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from urllib.parse import urlsplit


def _device_ip(name: str) -> str:
    SIOCGIFADDR = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
    return socket.inet_ntoa(packed[20:24])


def node_ip(interface: str | None, store_url: str) -> str:
    """The address peers reach this node at: ``interface`` (an address or a device name),
    else the one this node routes to the store from (no packet is sent)."""
    if interface:
        try:
            return str(ipaddress.IPv4Address(interface))
        except ValueError:
            return _device_ip(interface)
    host = urlsplit(store_url).hostname if "://" in store_url else None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host or "192.0.2.1", 9))   # TEST-NET: a route, never a packet
            return s.getsockname()[0]
        except OSError:
            return socket.gethostbyname(socket.gethostname())
