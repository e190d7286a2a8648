//! The replica's HTTP/1.1 request parse (`kubeserve/runtime/replica/http.py`), in one call per
//! request: the common request (HTTP/1.1, whole in the bytes read, `Content-Length` or no body,
//! a path that is its own normal form, UTF-8 text) comes back as the values `HttpRequest` is
//! made of. Anything else (a partial request, a chunked body, `Expect`, `Upgrade`, CONNECT,
//! HTTP/1.0, a target, head or body over the limits, a malformed request, bytes that are not
//! UTF-8) is left to the Python parser (httptools), which answers it as it always did: this
//! parse never refuses anything itself, so every error and limit stays where it was.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

/// Headers a request may have for this parse (more: httptools parses it).
const MAX_HEADERS: usize = 64;

/// `routes.needs_normalizing`: a path that holds `%`, `/.` or `//` is normalised by Python.
fn needs_normalizing(path: &[u8]) -> bool {
    path.contains(&b'%') || path.windows(2).any(|w| w == b"/." || w == b"//")
}

fn eq_lower(name: &str, lower: &str) -> bool {
    name.len() == lower.len() && name.eq_ignore_ascii_case(lower)
}

/// Whether a `Connection` value names `token` (case-insensitively, comma-separated).
fn names(value: &[u8], token: &str) -> bool {
    value.split(|&c| c == b',').any(|part| {
        std::str::from_utf8(part)
            .map(|p| p.trim().eq_ignore_ascii_case(token))
            .unwrap_or(false)
    })
}

/// The pieces of one parsed request (see [`parse_at`]).
pub struct Parsed<'py> {
    pub method: Bound<'py, PyAny>,
    pub path: Bound<'py, PyAny>,
    pub query: Bound<'py, PyAny>,
    pub headers: Bound<'py, PyAny>,
    pub body: Bound<'py, PyAny>,
    pub request_id: Bound<'py, PyAny>,
    pub keep_alive: Bound<'py, PyAny>,
    pub model_id: Bound<'py, PyAny>,
    /// where the request ends in the buffer
    pub end: usize,
}

/// Limits and rules of [`parse_at`]: `max_body` < 0 is no body limit; a path starting with
/// `stop_prefix` (when not empty) is left to httptools; `make_ids`: a request without an
/// `X-Request-Id` gets a new one (`http1.new_request_id`'s spelling).
pub struct Rules {
    pub max_url: usize,
    pub max_head: usize,
    pub max_body: i64,
    pub stop_prefix: Vec<u8>,
    pub make_ids: bool,
}

/// The request at `data[start..]`, or None when httptools must parse it (see the module):
/// `(method, path, query, headers, body, request_id, keep_alive, end, model_id)`, `headers` a
/// list of `(name, value)` as sent, `request_id` the first non-empty `X-Request-Id` ("" for
/// none), `end` where the request ends in `data`, `model_id` the first
/// `serve_multiplexed_model_id` header's value ("" for none). `max_body` < 0: no body limit.
#[pyfunction]
#[pyo3(signature = (data, start, max_url, max_head, max_body))]
pub fn parse_request<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyBytes>,
    start: usize,
    max_url: usize,
    max_head: usize,
    max_body: i64,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let rules = Rules {
        max_url,
        max_head,
        max_body,
        stop_prefix: Vec::new(),
        make_ids: false,
    };
    let Some(p) = parse_at(py, data.as_bytes(), start, &rules)? else {
        return Ok(None);
    };
    Ok(Some(PyTuple::new(
        py,
        [
            p.method,
            p.path,
            p.query,
            p.headers,
            p.body,
            p.request_id,
            p.keep_alive,
            p.end.into_pyobject(py)?.into_any(),
            p.model_id,
        ],
    )?))
}

/// [`parse_request`]'s parse of the request at `all[start..]`, under `rules`.
pub fn parse_at<'py>(
    py: Python<'py>,
    all: &[u8],
    start: usize,
    rules: &Rules,
) -> PyResult<Option<Parsed<'py>>> {
    if start >= all.len() {
        return Ok(None);
    }
    let buf = &all[start..];
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut slots);
    let head_len = match request.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => return Ok(None), // partial, malformed, too many headers
    };
    if head_len > rules.max_head || head_len < 4 || &buf[head_len - 4..head_len] != b"\r\n\r\n" {
        return Ok(None);
    }
    let (Some(method), Some(target), Some(1)) = (request.method, request.path, request.version)
    else {
        return Ok(None);
    };
    // (a target that is not ASCII: httptools, which keeps undecodable bytes as surrogates)
    if method == "CONNECT"
        || target.len() > rules.max_url
        || !target.starts_with('/')
        || !target.is_ascii()
    {
        return Ok(None);
    }
    let (path, query) = match target.find('?') {
        Some(q) => (&target[..q], &target[q + 1..]),
        None => (target, ""),
    };
    if needs_normalizing(path.as_bytes())
        || (!rules.stop_prefix.is_empty() && path.as_bytes().starts_with(&rules.stop_prefix))
    {
        return Ok(None);
    }
    let mut content_length: Option<usize> = None;
    let mut keep_alive = true;
    let mut request_id = "";
    let mut model_id: Option<&str> = None;
    let list = PyList::empty(py);
    for header in request.headers.iter() {
        let name = header.name;
        // httparse drops a value's trailing spaces and tabs, httptools keeps them: such a
        // (rare) header goes to httptools
        let value_end = header.value.as_ptr() as usize - buf.as_ptr() as usize + header.value.len();
        if buf.get(value_end) != Some(&b'\r') {
            return Ok(None);
        }
        let Ok(value) = std::str::from_utf8(header.value) else {
            return Ok(None);
        };
        match name.len() {
            12 if request_id.is_empty() && eq_lower(name, "x-request-id") => request_id = value,
            14 if eq_lower(name, "content-length") => {
                if content_length.is_some()
                    || value.is_empty()
                    || !value.bytes().all(|c| c.is_ascii_digit())
                    || value.len() > 18
                {
                    return Ok(None);
                }
                content_length = Some(value.parse().expect("digits"));
            }
            10 if eq_lower(name, "connection") => {
                if names(value.as_bytes(), "upgrade") {
                    return Ok(None);
                }
                if names(value.as_bytes(), "close") {
                    keep_alive = false;
                }
            }
            17 if eq_lower(name, "transfer-encoding") => return Ok(None),
            26 if model_id.is_none() && eq_lower(name, "serve_multiplexed_model_id") => {
                model_id = Some(value)
            }
            6 if eq_lower(name, "expect") => return Ok(None),
            7 if eq_lower(name, "upgrade") => return Ok(None),
            _ => {}
        }
        list.append((PyString::new(py, name), PyString::new(py, value)))?;
    }
    let length = content_length.unwrap_or(0);
    if rules.max_body >= 0 && length as u64 > rules.max_body as u64 {
        return Ok(None);
    }
    if buf.len() - head_len < length {
        return Ok(None); // the body is still arriving
    }
    let body = PyBytes::new(py, &buf[head_len..head_len + length]);
    let request_id = if request_id.is_empty() && rules.make_ids {
        PyString::new(py, std::str::from_utf8(&new_request_id()).expect("hex"))
    } else {
        PyString::new(py, request_id)
    };
    Ok(Some(Parsed {
        method: PyString::new(py, method).into_any(),
        path: PyString::new(py, path).into_any(),
        query: PyString::new(py, query).into_any(),
        headers: list.into_any(),
        body: body.into_any(),
        request_id: request_id.into_any(),
        keep_alive: pyo3::types::PyBool::new(py, keep_alive).to_owned().into_any(),
        model_id: PyString::new(py, model_id.unwrap_or("")).into_any(),
        end: start + head_len + length,
    }))
}

/// A fresh request id as `http1.new_request_id` spells it: 128 bits as 32 lowercase hex
/// digits. splitmix64 over a counter seeded from the standard library's per-process random
/// keys: unique within the process (a bijection of the counter), unrelated across processes;
/// ids must be unique, not secret.
pub fn new_request_id() -> [u8; 32] {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static SEED: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish()
    });
    let mix = |n: u64| {
        let mut z = seed.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let n = COUNTER.fetch_add(2, Ordering::Relaxed);
    let mut bits = [0u8; 16];
    bits[..8].copy_from_slice(&mix(n).to_le_bytes());
    bits[8..].copy_from_slice(&mix(n + 1).to_le_bytes());
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 32];
    for (i, b) in bits.iter().enumerate() {
        out[2 * i] = HEX[(b >> 4) as usize];
        out[2 * i + 1] = HEX[(b & 15) as usize];
    }
    out
}
