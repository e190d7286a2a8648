"""The proxy's TLS files reloaded on change (:class:`kubeserve.runtime.tls.ReloadingContext`):
a renewal that is valid serves new handshakes; files that would fail every handshake (a key that
is not the certificate's, an expired certificate) leave the previous certificate serving.

Real TLS: a listening socket with the reloading context and a client that verifies against the
CA and reports which certificate each new handshake presented."""

from __future__ import annotations

import shutil
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubeserve.runtime.tls import ReloadingContext, TLSFiles
from support.tls_certs import Authority, Pair


class Listener:
    """A TLS server on 127.0.0.1 that completes each handshake with the newest context of
    ``reloading`` (as the proxy does) and closes."""

    def __init__(self, reloading: ReloadingContext) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.reloading = reloading
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                with self.reloading.current.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)
            except OSError:
                conn.close()

    def presented(self, ca: Authority) -> bytes:
        """The certificate a new handshake presents (verified against ``ca``)."""
        context = ssl.create_default_context(cafile=str(ca.path))
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            return tls.getpeercert(binary_form=True) or b""

    def close(self) -> None:
        self.sock.close()


def der(pair: Pair) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pair.cert.read_text())


@pytest.fixture
def ca(tmp_path: Path) -> Authority:
    return Authority(tmp_path / "ca")


@pytest.fixture
def served(tmp_path: Path, ca: Authority) -> Iterator[tuple[ReloadingContext, Listener, Pair]]:
    first = ca.issue("first")
    files = TLSFiles(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    install(first, files)
    reloading = ReloadingContext(files)
    listener = Listener(reloading)
    yield reloading, listener, first
    listener.close()


def install(pair: Pair, files: TLSFiles) -> None:
    """Write ``pair`` over the served files (a new inode each, as a Secret volume's swap)."""
    for source, target in ((pair.cert, files.certfile), (pair.key, files.keyfile)):
        shutil.copyfile(source, f"{target}.new")
        Path(f"{target}.new").replace(target)


def test_a_valid_renewal_serves_new_handshakes(
    served: tuple[ReloadingContext, Listener, Pair], ca: Authority
) -> None:
    reloading, listener, first = served
    assert listener.presented(ca) == der(first)
    second = ca.issue("second")
    install(second, reloading.files)
    assert reloading.reload_if_changed()
    assert listener.presented(ca) == der(second)


@pytest.mark.parametrize("bad", ["expired", "mismatched"])
def test_files_that_would_fail_every_handshake_keep_the_previous_serving(
    served: tuple[ReloadingContext, Listener, Pair], ca: Authority, bad: str
) -> None:
    reloading, listener, first = served
    if bad == "expired":
        install(ca.issue("old", expired=True), reloading.files)
    else:
        third, other = ca.issue("third"), ca.issue("other")
        install(Pair(third.cert, other.key), reloading.files)
    assert not reloading.reload_if_changed()
    assert listener.presented(ca) == der(first)
    assert reloading.reloads == 0
