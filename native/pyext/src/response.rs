//! The handle client's answer parse (`kubeserve/runtime/handle_client.py`'s `_CallConnection`),
//! in one call: the common answer (HTTP/1.1, whole in the bytes opened, a `Content-Length`, no
//! bytes after it) comes back as the values the caller takes; anything else (a partial answer,
//! a chunked body, no length, more than one answer, a malformed one) is left to httptools, which
//! parses it as it always did.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyString, PyTuple};

/// Headers an answer may have for this parse (more: httptools parses it).
const MAX_HEADERS: usize = 32;

/// The names (lowercase) of the two headers the caller reads besides the length.
pub struct AnswerNames {
    pub unserved: Vec<u8>,
    pub models: Vec<u8>,
}

/// The answer that `buf` holds exactly, or None (see the module): `(status, body, keep_alive,
/// unserved, models)`, `unserved` the last `unserved` header's value ("unserved" when empty,
/// "" without one), `models` the last `models` header's value as bytes (None without one).
pub fn parse_answer<'py>(
    py: Python<'py>,
    buf: &[u8],
    names: &AnswerNames,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut slots);
    let head_len = match response.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => return Ok(None),
    };
    let (Some(1), Some(status)) = (response.version, response.code) else {
        return Ok(None);
    };
    if status < 200 || status == 204 || status == 304 {
        return Ok(None);
    }
    let mut length: Option<usize> = None;
    let mut keep_alive = true;
    let mut unserved: Option<&[u8]> = None;
    let mut models: Option<&[u8]> = None;
    for header in response.headers.iter() {
        let name = header.name.as_bytes();
        let value = header.value;
        if name.eq_ignore_ascii_case(b"content-length") {
            if length.is_some()
                || value.is_empty()
                || value.len() > 18
                || !value.iter().all(u8::is_ascii_digit)
            {
                return Ok(None);
            }
            length = Some(std::str::from_utf8(value).expect("digits").parse().expect("digits"));
        } else if name.eq_ignore_ascii_case(b"transfer-encoding")
            || name.eq_ignore_ascii_case(b"upgrade")
        {
            return Ok(None);
        } else if name.eq_ignore_ascii_case(b"connection") {
            let close = value.split(|&c| c == b',').any(|part| {
                std::str::from_utf8(part)
                    .map(|p| p.trim().eq_ignore_ascii_case("close"))
                    .unwrap_or(false)
            });
            if close {
                keep_alive = false;
            } else if !value.eq_ignore_ascii_case(b"keep-alive") {
                return Ok(None); // (anything else: httptools decides)
            }
        } else if name.eq_ignore_ascii_case(&names.unserved) {
            unserved = Some(value);
        } else if name.eq_ignore_ascii_case(&names.models) {
            models = Some(value);
        }
    }
    let Some(length) = length else {
        return Ok(None);
    };
    if buf.len() != head_len + length {
        return Ok(None); // still arriving, or more than this answer
    }
    let unserved = match unserved {
        None => "",
        Some(b"") => "unserved",
        Some(v) => match std::str::from_utf8(v) {
            Ok(text) if text.is_ascii() => text,
            _ => return Ok(None), // (latin-1 beyond ASCII: httptools' path decodes it)
        },
    };
    let models = match models {
        None => py.None().into_bound(py),
        Some(v) => PyBytes::new(py, v).into_any(),
    };
    Ok(Some(PyTuple::new(
        py,
        [
            status.into_pyobject(py)?.into_any(),
            PyBytes::new(py, &buf[head_len..]).into_any(),
            PyBool::new(py, keep_alive).to_owned().into_any(),
            PyString::new(py, unserved).into_any(),
            models,
        ],
    )?))
}
