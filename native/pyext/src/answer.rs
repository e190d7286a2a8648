//! The head (and body) of a replica's complete answer in one call: `_Connection._write_head` of
//! `kubeserve/runtime/replica/http.py`, byte for byte.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};

/// `text` as Latin-1 bytes (what `str.encode("latin-1")` gives), or None when a character
/// does not fit (the Python path then raises, as it always did).
fn latin1(text: &str, out: &mut Vec<u8>) -> bool {
    if text.is_ascii() {
        out.extend_from_slice(text.as_bytes());
        return true;
    }
    for c in text.chars() {
        match u8::try_from(u32::from(c)) {
            Ok(b) => out.push(b),
            Err(_) => return false,
        }
    }
    true
}

/// `status` line (`reason` its phrase), `date_line`, `x-request-id` (when `request_id` is not
/// empty and `headers` has none), `headers` (a dict of str), `Content-Length` of `body` (when
/// given), `Connection: close` (unless `keep_alive`), the blank line and `body`; None when a
/// header or the request id is not Latin-1 (the Python path answers it).
#[pyfunction]
#[pyo3(signature = (status, reason, date_line, request_id, headers, body, keep_alive))]
#[allow(clippy::too_many_arguments)]
pub fn answer<'py>(
    py: Python<'py>,
    status: i64,
    reason: &[u8],
    date_line: &[u8],
    request_id: &str,
    headers: &Bound<'py, PyAny>,
    body: Option<&Bound<'py, PyAny>>,
    keep_alive: bool,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    Ok(format(status, reason, date_line, request_id, headers, body, keep_alive)?
        .map(|out| PyBytes::new(py, &out)))
}

/// [`answer`]'s bytes, or None when the Python path must format them.
pub fn format(
    status: i64,
    reason: &[u8],
    date_line: &[u8],
    request_id: &str,
    headers: &Bound<'_, PyAny>,
    body: Option<&Bound<'_, PyAny>>,
    keep_alive: bool,
) -> PyResult<Option<Vec<u8>>> {
    let Ok(headers) = headers.downcast::<PyDict>() else {
        return Ok(None); // not a dict: the Python path
    };
    let body: Option<&[u8]> = match body {
        None => None,
        Some(b) => match b.downcast::<PyBytes>() {
            Ok(bytes) => Some(bytes.as_bytes()),
            Err(_) => return Ok(None), // not bytes: the Python path
        },
    };
    let mut out = Vec::with_capacity(160 + body.map_or(0, <[u8]>::len));
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(reason);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(date_line);
    if !request_id.is_empty() && !headers.contains("x-request-id")? {
        out.extend_from_slice(b"x-request-id: ");
        if !request_id.is_ascii() {
            return Ok(None);
        }
        out.extend_from_slice(request_id.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    for (name, value) in headers.iter() {
        let (Ok(name), Ok(value)) = (name.downcast::<PyString>(), value.downcast::<PyString>())
        else {
            return Ok(None);
        };
        if !latin1(name.to_str()?, &mut out) {
            return Ok(None);
        }
        out.extend_from_slice(b": ");
        if !latin1(value.to_str()?, &mut out) {
            return Ok(None);
        }
        out.extend_from_slice(b"\r\n");
    }
    if let Some(body) = body {
        out.extend_from_slice(b"Content-Length: ");
        out.extend_from_slice(body.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !keep_alive {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if let Some(body) = body {
        out.extend_from_slice(body);
    }
    Ok(Some(out))
}
