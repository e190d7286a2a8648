"""The TLS files as the native data path takes them (:func:`kubeserve.runtime.tls.native_tls`):
PEM text in memory, the key decrypted, checked against the certificate, and kept current by a
:class:`~kubeserve.runtime.tls.ReloadingContext` made with ``native=True``."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from kubeserve.runtime.tls import ReloadingContext, TLSFileError, TLSFiles, native_tls
from support.tls_certs import Authority

PASSWORD = "correct horse"


def _spki(key_or_cert: object) -> bytes:
    public = key_or_cert.public_key()  # type: ignore[attr-defined]
    return bytes(
        public.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def test_an_encrypted_key_is_handed_over_decrypted_and_matching(tmp_path: Path) -> None:
    ca = Authority(tmp_path / "ca")
    pair = ca.issue("server", password=PASSWORD.encode())
    assert b"ENCRYPTED" in pair.key.read_bytes()
    files = TLSFiles(str(pair.cert), str(pair.key), PASSWORD, str(ca.path))
    native = native_tls(files)
    assert native.key_pem.startswith("-----BEGIN PRIVATE KEY-----")
    key = serialization.load_pem_private_key(native.key_pem.encode(), None)
    certificate = x509.load_pem_x509_certificate(native.cert_pem.encode())
    assert _spki(key) == _spki(certificate)
    assert native.ca_pem == ca.path.read_text()
    assert PASSWORD not in repr(native) and "PRIVATE" not in repr(native)


def test_one_file_with_both_and_a_password_for_a_plain_key(tmp_path: Path) -> None:
    pair = Authority(tmp_path / "ca").issue("server")
    both = tmp_path / "both.pem"
    both.write_bytes(pair.cert.read_bytes() + pair.key.read_bytes())
    native = native_tls(TLSFiles(str(both), str(both), "ignored"))  # OpenSSL ignores it too
    assert native.key_pem.startswith("-----BEGIN PRIVATE KEY-----")


def test_a_wrong_password_or_another_key_names_the_field(tmp_path: Path) -> None:
    ca = Authority(tmp_path / "ca")
    pair = ca.issue("server", password=PASSWORD.encode())
    other = ca.issue("other")
    with pytest.raises(TLSFileError) as wrong:
        native_tls(TLSFiles(str(pair.cert), str(pair.key), "wrong"))
    assert wrong.value.field == "ssl_keyfile"
    with pytest.raises(TLSFileError, match="is not the key of") as mismatched:
        native_tls(TLSFiles(str(pair.cert), str(other.key)))
    assert mismatched.value.field == "ssl_keyfile"


def test_a_reload_renews_what_the_native_path_gets(tmp_path: Path) -> None:
    ca = Authority(tmp_path / "ca")
    first, second = ca.issue("first"), ca.issue("second")
    live_cert, live_key = tmp_path / "live.crt", tmp_path / "live.key"
    live_cert.write_bytes(first.cert.read_bytes())
    live_key.write_bytes(first.key.read_bytes())
    reloading = ReloadingContext(TLSFiles(str(live_cert), str(live_key)), native=True)
    pushed: list[str] = []
    reloading.on_reload = lambda: pushed.append(
        reloading.native.cert_pem if reloading.native else ""
    )
    assert reloading.native is not None and reloading.native.cert_pem == first.cert.read_text()
    live_key.write_bytes(second.key.read_bytes())
    live_cert.write_bytes(second.cert.read_bytes())
    assert reloading.reload_if_changed()
    assert pushed == [second.cert.read_text()]
    live_key.write_bytes(first.key.read_bytes())  # a key not the certificate's: nothing changes
    assert not reloading.reload_if_changed()
    assert reloading.native.cert_pem == second.cert.read_text() and len(pushed) == 1
