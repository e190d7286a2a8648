"""TLS on the proxy's listening socket: Ray's ``http_options.ssl_*`` files, checked, loaded, and
reloaded when they change on disk.

Rotation without dropping connections: each accepted connection's handshake takes the newest
loaded context, :attr:`ReloadingContext.current` (the proxy runs TLS itself, see
:mod:`~kubeserve.runtime.tls_stream`; no dispatching ``sni_callback``, which cost every handshake
a Python call and a context switch inside OpenSSL). A poll notices the files changing (a new
inode, size or mtime: a Kubernetes Secret volume swaps a symlink, ``cp`` rewrites in place) and
loads them into a new context; new handshakes get it, established connections keep the keys they
agreed. Files that do not load (half written, a key that does not match the certificate, a
certificate expired or not yet valid: a Kubernetes Secret updated with one reaches the running
proxies whatever the operator says) leave the previous context serving and are tried again at the
next change.

Client certificates: given ``ca_certs``, every client must present a certificate that CA signed
(``CERT_REQUIRED``; Ray's uvicorn only asks for one optionally). The verification mode is fixed
for the proxy's lifetime; the CA bundle is reloaded with the rest.

Plain HTTP is not touched: without TLS settings the proxy's connections have no TLS layer.

The native data path (:mod:`~kubeserve.runtime.fastpath`) terminates TLS itself, with the same
files: a :class:`ReloadingContext` made with ``native=True`` also holds them as
:class:`NativeTLS`, PEM text in memory with the key decrypted (never written anywhere), read
once and checked (the key is the certificate's) each time the files load, for the proxy to push.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kubeserve.runtime.tasks import cancel_and_wait

if TYPE_CHECKING:
    import datetime

__all__ = [
    "PASSWORD_ENV",
    "NativeTLS",
    "ReloadingContext",
    "TLSFileError",
    "TLSFiles",
    "check_files",
    "native_tls",
    "server_context",
    "valid_context",
    "wait_for_files",
]

log = logging.getLogger(__name__)

#: the environment variable a proxy takes the key's password from (never its command line)
PASSWORD_ENV = "KUBESERVE_SSL_KEYFILE_PASSWORD"
#: how often the files are looked at for a rotation (a few ``stat`` calls each time)
POLL_S = 2.0


@dataclass(frozen=True)
class TLSFiles:
    """Ray's ``http_options.ssl_*``: paths on the proxy's machine, and the key's password."""

    certfile: str
    keyfile: str
    password: str | None = None
    ca_certs: str | None = None

    @classmethod
    def from_http_options(cls, http: Mapping[str, Any]) -> TLSFiles | None:
        """The files Ray's ``http_options`` name, or ``None`` for plain HTTP."""
        if not http.get("ssl_certfile") or not http.get("ssl_keyfile"):
            return None
        return cls(
            str(http["ssl_certfile"]),
            str(http["ssl_keyfile"]),
            http.get("ssl_keyfile_password") or None,
            http.get("ssl_ca_certs") or None,
        )

    def paths(self) -> tuple[str, ...]:
        return (self.certfile, self.keyfile) + ((self.ca_certs,) if self.ca_certs else ())


class TLSFileError(ValueError):
    """Files that cannot serve TLS; ``field`` is the ``http_options`` field at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _readable(path: str, field: str) -> None:
    try:
        with open(path, "rb") as file:
            file.read(1)
    except OSError as exc:
        raise TLSFileError(field, f"{field} {path!r} cannot be read: {exc.strerror}") from None


def _no_prompt(password: str | None) -> str:
    """OpenSSL prompts on the terminal for an encrypted key without a password callback."""
    return password or ""


def server_context(files: TLSFiles) -> ssl.SSLContext:
    """A server context serving ``files``; :class:`TLSFileError` names the field at fault."""
    for path, field in ((files.certfile, "ssl_certfile"), (files.keyfile, "ssl_keyfile")):
        _readable(path, field)
    _load_certificates(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), files.certfile, "ssl_certfile")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(files.certfile, files.keyfile, lambda: _no_prompt(files.password))
    except ssl.SSLError as exc:
        raise _key_error(files, exc) from None
    if files.ca_certs:
        _readable(files.ca_certs, "ssl_ca_certs")
        _load_certificates(context, files.ca_certs, "ssl_ca_certs")
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _load_certificates(context: ssl.SSLContext, path: str, field: str) -> None:
    """Load the PEM certificates of ``path`` as trusted; :class:`TLSFileError` at ``field`` when
    it holds none."""
    try:
        context.load_verify_locations(cafile=path)
    except ssl.SSLError as exc:
        raise TLSFileError(field, f"{field} {path!r} holds no PEM certificate: {exc}") from None


def _key_error(files: TLSFiles, exc: ssl.SSLError) -> TLSFileError:
    if "KEY_VALUES_MISMATCH" in str(exc.reason or exc):
        return TLSFileError(
            "ssl_keyfile",
            f"ssl_keyfile {files.keyfile!r} is not the key of ssl_certfile {files.certfile!r}",
        )
    if _encrypted(files.keyfile):
        return TLSFileError(
            "ssl_keyfile_password",
            f"ssl_keyfile {files.keyfile!r} is encrypted and ssl_keyfile_password "
            + ("does not decrypt it" if files.password else "is not given"),
        )
    return TLSFileError("ssl_keyfile", f"ssl_keyfile {files.keyfile!r} holds no usable key: {exc}")


def _encrypted(keyfile: str) -> bool:
    """A PEM key that needs a password (PKCS#8 or OpenSSL's traditional encrypted form)."""
    try:
        with open(keyfile, "rb") as file:
            text = file.read(1 << 20)
    except OSError:
        return False
    return b"ENCRYPTED PRIVATE KEY" in text or b"Proc-Type: 4,ENCRYPTED" in text


def check_files(files: TLSFiles, now: datetime.datetime | None = None) -> None:
    """What :func:`valid_context` checks, where configs are checked (nothing is served)."""
    valid_context(files, now)


def valid_context(files: TLSFiles, now: datetime.datetime | None = None) -> ssl.SSLContext:
    """:func:`server_context`, once the certificate is valid now: an expired one would load and
    then fail every client's handshake."""
    context = server_context(files)
    import datetime  # (as cryptography: not in a proxy without TLS)

    from cryptography import x509  # when files change or a config is checked, not at start-up

    with open(files.certfile, "rb") as file:
        certificate = x509.load_pem_x509_certificate(file.read())
    now = now or datetime.datetime.now(datetime.UTC)
    if certificate.not_valid_after_utc <= now:
        raise TLSFileError(
            "ssl_certfile",
            f"ssl_certfile {files.certfile!r} expired on "
            f"{certificate.not_valid_after_utc:%Y-%m-%d %H:%M:%S} UTC",
        )
    if certificate.not_valid_before_utc > now:
        raise TLSFileError(
            "ssl_certfile",
            f"ssl_certfile {files.certfile!r} is not valid before "
            f"{certificate.not_valid_before_utc:%Y-%m-%d %H:%M:%S} UTC",
        )
    return context


@dataclass(frozen=True, repr=False)
class NativeTLS:
    """The files as the native data path takes them: PEM text, the key decrypted (PKCS#8)."""

    cert_pem: str
    key_pem: str
    ca_pem: str | None


#: one PEM private key (PKCS#8, encrypted PKCS#8, or a traditional RSA/EC key with its headers)
_PEM_KEY = re.compile(
    rb"-----BEGIN ((?:ENCRYPTED |RSA |EC )?PRIVATE KEY)-----.+?-----END \1-----", re.DOTALL
)


def native_tls(files: TLSFiles) -> NativeTLS:
    """Read ``files`` once, decrypt the key with the password, check that it is the key of the
    (first) certificate; :class:`TLSFileError` names the field at fault. Called after
    :func:`server_context` loaded the same files, so the errors here are races with a rotation
    (or a key OpenSSL reads and ``cryptography`` does not)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    def read(path: str, field: str) -> bytes:
        try:
            with open(path, "rb") as file:
                return file.read(_MAX_PEM + 1)[:_MAX_PEM]
        except OSError as exc:
            raise TLSFileError(field, f"{field} {path!r} cannot be read: {exc.strerror}") from None

    cert_pem = read(files.certfile, "ssl_certfile")
    try:
        certificate = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise TLSFileError("ssl_certfile", f"ssl_certfile {files.certfile!r}: {exc}") from None
    found = _PEM_KEY.search(read(files.keyfile, "ssl_keyfile"))
    if found is None:
        raise TLSFileError("ssl_keyfile", f"ssl_keyfile {files.keyfile!r} holds no PEM key")
    password = files.password.encode() if files.password else None
    try:
        try:
            key = serialization.load_pem_private_key(found.group(0), password)
        except TypeError:  # a password given for a key not encrypted: OpenSSL ignores it too
            key = serialization.load_pem_private_key(found.group(0), None)
    except (ValueError, TypeError) as exc:
        raise TLSFileError("ssl_keyfile", f"ssl_keyfile {files.keyfile!r}: {exc}") from None
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(*spki) != certificate.public_key().public_bytes(*spki):
        raise TLSFileError(
            "ssl_keyfile",
            f"ssl_keyfile {files.keyfile!r} is not the key of ssl_certfile {files.certfile!r}",
        )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    ca_pem = (
        read(files.ca_certs, "ssl_ca_certs").decode("ascii", "replace") if files.ca_certs else None
    )
    return NativeTLS(cert_pem.decode("ascii", "replace"), key_pem.decode(), ca_pem)


#: the most of one PEM file read for the native data path (what it accepts)
_MAX_PEM = 1 << 20


def _signature(paths: tuple[str, ...]) -> tuple[tuple[int, int, int, int], ...]:
    """What changes when a file is replaced or rewritten (``stat`` follows symlinks)."""
    signature = []
    for path in paths:
        try:
            st = os.stat(path)
            signature.append((st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns))
        except OSError:
            signature.append((0, 0, 0, 0))
    return tuple(signature)


class ReloadingContext:
    """The listening context of a TLS proxy and the poll that reloads its files.

    Owns the newest loaded context, :attr:`current`: each new handshake is made with it (read it
    per connection, never keep it).
    """

    def __init__(self, files: TLSFiles, poll_s: float = POLL_S, *, native: bool = False) -> None:
        """Raises :class:`TLSFileError` when the files do not load now. ``native``: keep
        :attr:`native` too, the files as the native data path takes them."""
        self.files = files
        self.poll_s = poll_s
        self._signature = _signature(files.paths())
        self.current = server_context(files)
        self.native = native_tls(files) if native else None
        self.reloads = 0
        #: called after each reload that serves (the native data path's proxy pushes the files)
        self.on_reload: Callable[[], None] | None = None
        self._task: asyncio.Task[None] | None = None

    def reload_if_changed(self) -> bool:
        """Load the files when they changed since the last look; ``True`` when a new context
        now serves. A failure is logged once per change and the previous context kept."""
        signature = _signature(self.files.paths())
        if signature == self._signature:
            return False
        self._signature = signature
        try:  # a renewal that is not valid yet, or no longer, would fail every handshake
            context = valid_context(self.files)
            native = native_tls(self.files) if self.native is not None else None
        except TLSFileError as exc:
            log.warning("TLS files changed but do not load, still serving the previous: %s", exc)
            return False
        self.current, self.native = context, native
        self.reloads += 1
        log.info("TLS files reloaded: new connections use them")
        if self.on_reload is not None:
            self.on_reload()
        return True

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._poll())

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            self.reload_if_changed()

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)


async def wait_for_files(
    files: TLSFiles, poll_s: float = POLL_S, *, native: bool = False
) -> ReloadingContext:
    """The files' context once they load: a proxy whose files are missing or broken waits for
    them (saying why, once per change) instead of exiting to be restarted in a loop.
    ``native``: see :class:`ReloadingContext`."""
    logged: tuple[tuple[int, int, int, int], ...] | None = None
    while True:
        try:
            return ReloadingContext(files, poll_s, native=native)
        except TLSFileError as exc:
            signature = _signature(files.paths())
            if signature != logged:
                logged = signature
                log.error("not listening until the TLS files load: %s", exc)
        await asyncio.sleep(poll_s)
