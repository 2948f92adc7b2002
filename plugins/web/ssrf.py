"""Which URLs ``web_fetch`` may reach: server-side request forgery protection.

The model chooses the URL, and a page it reads may choose the next one, so a URL
is never trusted. Every hop (the first request and each redirect) is checked:

* the scheme is ``http`` or ``https``; the URL carries no user name or password;
* the host is resolved (the resolver can be injected for tests) and **every**
  address it resolves to must be public: loopback, private, link-local, shared
  (CGNAT), multicast, reserved, unspecified and cloud metadata addresses are
  refused, also when hidden in an IPv6 form (IPv4-mapped, 6to4, Teredo, NAT64);
* ``allow_private`` CIDRs let chosen addresses through (self-hosted sites).

The request then goes to the checked address itself (:class:`Target`), with the
host name kept in ``Host`` and in TLS (SNI and certificate checks), so a second
DNS answer (rebinding) cannot redirect it elsewhere.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from plugins.web._http import web_error

if TYPE_CHECKING:
    import httpx

__all__ = [
    "METADATA_ADDRESSES",
    "AddressPolicy",
    "Guard",
    "IPAddress",
    "Resolver",
    "Target",
    "check_url",
    "system_resolver",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

Resolver = Callable[[str, int], Awaitable[Sequence[str]]]
"""``await resolver(host, port)``: the addresses ``host`` resolves to, as text.
Raises :class:`socket.gaierror` when the name does not resolve."""

METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean...
    "fd00:ec2::254",    # AWS over IPv6
    "169.254.170.2",    # AWS ECS task credentials
    "100.100.100.200",  # Alibaba Cloud
))
"""Cloud instance metadata services: they hand out credentials to whoever asks."""

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SCHEMES = ("http", "https")


async def system_resolver(host: str, port: int) -> list[str]:
    """The addresses of ``host`` from the system resolver (``getaddrinfo``), without repeats."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses: list[str] = []
    for *_, sockaddr in infos:
        address = str(sockaddr[0]).split("%", 1)[0]  # an IPv6 zone id is not part of it
        if address not in addresses:
            addresses.append(address)
    return addresses


class AddressPolicy:
    """Which addresses may be reached: public ones, plus the ``allow`` CIDRs."""

    def __init__(self, allow: Iterable[str] = ()) -> None:
        self.allow = tuple(ipaddress.ip_network(cidr, strict=False) for cidr in allow)

    def refusal(self, address: IPAddress) -> str | None:
        """Why ``address`` may not be reached (``"a loopback address"``), or ``None``."""
        forms = _forms(address)
        if any(form in net for form in forms for net in self.allow):
            return None
        for form in forms:
            if (reason := _not_public(form)) is not None:
                return reason
        return None


@dataclass(frozen=True, slots=True)
class Target:
    """A checked URL and the addresses to send its request to."""

    url: httpx.URL
    """The URL as asked (host name kept): what the result names."""
    addresses: tuple[IPAddress, ...]
    """The checked addresses the connection may go to, in the resolver's order."""

    @property
    def hostname(self) -> str:
        """The host as sent on the wire (IDNA-encoded): for SNI and certificate checks."""
        return self.url.raw_host.decode("ascii")

    @property
    def host_header(self) -> str:
        """The ``Host`` header: the host, with the port when the URL names one."""
        return self.url.netloc.decode("ascii")

    def connect_url(self, address: IPAddress) -> httpx.URL:
        """The URL with ``address`` (one of :attr:`addresses`) in place of the host name."""
        return self.url.copy_with(host=str(address))


def check_url(url: str | httpx.URL) -> httpx.URL:
    """``url`` parsed, if its form is acceptable: http(s), a host, no credentials.

    Raises :class:`ToolError` (``INVALID_URL``, ``UNSUPPORTED_SCHEME``,
    ``CREDENTIALS_IN_URL``) otherwise.
    """
    import httpx  # here, not at start: only a fetch needs it

    try:
        parsed = url if isinstance(url, httpx.URL) else httpx.URL(url.strip())
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise web_error(f"not a valid URL: {str(url)[:200]!r} ({exc})", "INVALID_URL",
                        error_type="syntax_error") from None
    if parsed.scheme not in _SCHEMES:
        scheme = parsed.scheme or "(none)"
        raise web_error(f"only http and https URLs can be fetched, not {scheme}: "
                        f"{str(parsed)[:200]}", "UNSUPPORTED_SCHEME",
                        error_type="permission_denied")
    if not parsed.raw_host:
        raise web_error(f"the URL names no host: {str(parsed)[:200]!r}", "INVALID_URL",
                        error_type="syntax_error")
    if parsed.userinfo:
        # The credentials would be sent to the host, and the model should not
        # be handling passwords anyway.
        raise web_error("URLs with a user name or password are refused; remove the "
                        "'user:password@' part", "CREDENTIALS_IN_URL",
                        error_type="permission_denied")
    return parsed


class Guard:
    """Checks URLs and resolves them to an address that may be reached."""

    def __init__(self, policy: AddressPolicy, resolver: Resolver = system_resolver) -> None:
        self.policy = policy
        self.resolver = resolver

    async def target(self, url: str | httpx.URL) -> Target:
        """Where ``url`` may be fetched from; raises :class:`ToolError` if it may not.

        ``BLOCKED_ADDRESS`` when an address of the host is not public (and not
        allowed); ``UNKNOWN_HOST`` when the name does not resolve, ``DNS_FAILED``
        (retryable) when resolving failed for now.
        """
        parsed = check_url(url)
        host = parsed.raw_host.decode("ascii")
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        literal = _literal(host)
        if literal is not None:
            addresses = [literal]
        else:
            addresses = await self._resolve(host, port)
        for address in addresses:
            reason = self.policy.refusal(address)
            if reason is not None:
                shown = f"{address} is" if literal is not None \
                    else f"{host} resolves to {address},"
                raise web_error(
                    f"{shown} {reason}: refused. web_fetch reaches only public addresses "
                    "(an admin can allow a private range with allow_private in "
                    f"[plugins.\"plugins.web\"]). URL: {str(parsed)[:200]}", "BLOCKED_ADDRESS",
                    error_type="permission_denied", url=parsed, address=str(address),
                    action="Use a public URL; do not retry this one")
        return Target(parsed, tuple(addresses))

    async def _resolve(self, host: str, port: int) -> list[IPAddress]:
        try:
            found = await self.resolver(host, port)
        except socket.gaierror as exc:
            if exc.errno == socket.EAI_AGAIN:
                raise web_error(f"could not resolve {host} for now: {exc.strerror}",
                                "DNS_FAILED", retryable=True,
                                error_type="connection_error") from None
            raise web_error(f"no such host: {host} (DNS: {exc.strerror})", "UNKNOWN_HOST",
                            error_type="resource_not_found",
                            action="Check the spelling of the host name") from None
        except OSError as exc:
            raise web_error(f"could not resolve {host}: {exc}", "DNS_FAILED",
                            retryable=True, error_type="connection_error") from None
        addresses: list[IPAddress] = []
        for text in found:
            try:
                addresses.append(ipaddress.ip_address(text))
            except ValueError:
                continue
        if not addresses:
            raise web_error(f"no such host: {host} has no address", "UNKNOWN_HOST",
                            error_type="resource_not_found")
        return addresses


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _forms(address: IPAddress) -> list[IPAddress]:
    """Every IPv4 address an IPv6 form of ``address`` carries, then ``address``."""
    forms: list[IPAddress] = []
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            forms.append(address.ipv4_mapped)
        if address.sixtofour is not None:
            forms.append(address.sixtofour)
        if address.teredo is not None:
            forms.extend(address.teredo)
        if address in _NAT64:
            forms.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    # The embedded address first: its reason ("a loopback address") says more.
    return [*forms, address]


def _not_public(address: IPAddress) -> str | None:
    if address in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_multicast:
        return "a multicast address"
    if address.is_unspecified:
        return "an unspecified address"
    if address.is_private:
        return "a private address"
    if address.is_reserved:
        return "a reserved address"
    if not address.is_global:
        return "not a public address"
    return None
