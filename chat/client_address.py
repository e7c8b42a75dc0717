"""The address a request came from, for limits that count per client.

Behind a reverse proxy REMOTE_ADDR is the proxy's, so every client looks the same; the
proxy names the client in X-Forwarded-For. That header is believed only when the request
comes from a proxy listed in settings.TRUSTED_PROXIES, and then only its right-most
entries: a client can write anything to the left of what the proxies append. We walk it
from the right, past our own proxies, and take the first address that is not one of them.
"""

import functools
import ipaddress

from django.conf import settings

# One IPv6 client usually holds a whole /64: counting per address would give it 2^64 tries.
IPV6_CLIENT_PREFIX = 64


@functools.lru_cache(maxsize=8)
def _networks(trusted: tuple[str, ...]):
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in trusted)


def _parse(text: str):
    try:
        address = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped or address


def _trusted(address, networks) -> bool:
    return any(address.version == net.version and address in net for net in networks)


def client_address(request) -> str:
    remote = request.META.get("REMOTE_ADDR", "")
    networks = _networks(tuple(settings.TRUSTED_PROXIES))
    hop = _parse(remote)
    if hop is None or not _trusted(hop, networks):
        return remote
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    for entry in reversed([e for e in forwarded.split(",") if e.strip()]):
        address = _parse(entry)
        if address is None:
            break  # not an address: nothing left of it can be vouched for
        hop = address
        if not _trusted(hop, networks):
            break
    return str(hop)


def client_key(address: str) -> str:
    """What limits count by: the address, or its /64 for IPv6."""
    parsed = _parse(address)
    if parsed is None or parsed.version == 4:
        return address
    return str(ipaddress.ip_network(f"{parsed}/{IPV6_CLIENT_PREFIX}", strict=False))
