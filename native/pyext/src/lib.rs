//! `kubeserve._native`: the replica's sealed channel (`kubeserve/runtime/sealing.py`) , its
//! request parse (`request.rs`), its answers' heads (`answer.rs`) and its requests' metrics and
//! access lines (`tally.rs`) in compiled code. The frames and their MACs are the proxy's own
//! code (`native/src/sealing.rs`, included here as a module), so both ends of a channel run one
//! implementation of the wire format; so are the access lines' formatter (`native/src/access.rs`,
//! included by `tally.rs`), so the proxy's lines and a replica's are one format.
//!
//! `Sealer.seal` and `Opener.feed` are the Python classes' methods, one call each: a write is one
//! frame (split at `MAX_FRAME`), a read gives every payload its complete frames carry (the
//! partial tail kept for the next read). Same wire bytes, same errors, same sequence numbers.
//!
//! Fused for the hot paths (no Python counterpart: the pure Python path opens, then parses):
//! `Opener.feed_requests` opens a replica's read and makes the whole common requests in it
//! (`request.rs`), `Sealer.seal_answer` formats a complete answer (`answer.rs`) and seals it,
//! and `Opener.feed_answer` opens a handle client's read and parses the answer it is
//! (`response.rs`); each leaves what it does not cover to httptools.

use pyo3::buffer::PyBuffer;
use pyo3::create_exception;
use pyo3::exceptions::PyConnectionError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

mod answer;
mod request;
mod response;
mod send;
mod tally;

#[allow(dead_code)] // `same` and `trim` serve the proxy only
#[path = "../../src/sealing.rs"]
mod sealing;

create_exception!(
    _native,
    FrameError,
    PyConnectionError,
    "A frame failed to verify or was malformed: the connection is not trustworthy any more."
);

/// The sending half of one direction: numbers and seals each payload it is given.
#[pyclass(module = "kubeserve._native")]
struct Sealer {
    inner: sealing::Sealer,
    out: Vec<u8>,
}

#[pymethods]
impl Sealer {
    #[new]
    fn new(key: &[u8]) -> Self {
        Sealer {
            inner: sealing::Sealer::new(key),
            out: Vec::new(),
        }
    }

    /// The frames of `payload` (any bytes-like object; one frame, or several past `MAX_FRAME`
    /// bytes; none for an empty payload).
    fn seal<'py>(
        &mut self,
        py: Python<'py>,
        payload: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        self.out.clear();
        if let Ok(bytes) = payload.downcast::<PyBytes>() {
            self.inner.seal_into(bytes.as_bytes(), &mut self.out);
        } else {
            self.inner.seal_into(&copied(payload)?, &mut self.out);
        }
        Ok(self.frames(py))
    }

    /// `seal` of the concatenation of `parts` (an iterable of bytes-like objects), without
    /// joining them first when they fit in one frame.
    fn seal_parts<'py>(
        &mut self,
        py: Python<'py>,
        parts: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let items: Vec<Bound<'py, PyAny>> = if let Ok(list) = parts.downcast::<PyList>() {
            list.iter().collect()
        } else if let Ok(tuple) = parts.downcast::<PyTuple>() {
            tuple.iter().collect()
        } else {
            parts.try_iter()?.collect::<PyResult<_>>()?
        };
        let mut owned: Vec<Vec<u8>> = Vec::new();
        for item in &items {
            if item.downcast::<PyBytes>().is_err() {
                owned.push(copied(item)?);
            }
        }
        let mut copies = owned.iter();
        let slices: Vec<&[u8]> = items
            .iter()
            .map(|item| match item.downcast::<PyBytes>() {
                Ok(bytes) => bytes.as_bytes(),
                Err(_) => copies.next().expect("one copy per non-bytes part"),
            })
            .collect();
        self.out.clear();
        self.inner.seal_parts_into(&slices, &mut self.out);
        Ok(self.frames(py))
    }

    /// The frame of a replica's complete answer (`answer`'s bytes, sealed) in one call, or
    /// None when the Python path must format it (see `answer`).
    #[pyo3(signature = (status, reason, date_line, request_id, headers, body, keep_alive))]
    #[allow(clippy::too_many_arguments)]
    fn seal_answer<'py>(
        &mut self,
        py: Python<'py>,
        status: i64,
        reason: &[u8],
        date_line: &[u8],
        request_id: &str,
        headers: &Bound<'py, PyAny>,
        body: Option<&Bound<'py, PyAny>>,
        keep_alive: bool,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let Some(whole) =
            answer::format(status, reason, date_line, request_id, headers, body, keep_alive)?
        else {
            return Ok(None);
        };
        self.out.clear();
        self.inner.seal_into(&whole, &mut self.out);
        Ok(Some(self.frames(py)))
    }
}

/// The bytes of a bytes-like object that is not `bytes` (bytearray, memoryview...).
fn copied(data: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    PyBuffer::<u8>::get(data)?.to_vec(data.py())
}

impl Sealer {
    /// What was sealed into `out`, as bytes; a large write's buffer is not kept for the
    /// connection's life.
    fn frames<'py>(&mut self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let frames = PyBytes::new(py, &self.out);
        if self.out.capacity() > 64 * 1024 {
            self.out = Vec::new();
        }
        frames
    }
}

/// The receiving half of one direction: fed what arrives, returns the verified payloads.
#[pyclass(module = "kubeserve._native")]
struct Opener {
    inner: sealing::Opener,
    plain: Vec<u8>,
    /// `serve_requests`' rules and request maker, once set
    serving: Option<(request::Rules, Py<PyAny>)>,
    /// `serve_answers`' header names, once set
    answers: Option<response::AnswerNames>,
}

#[pymethods]
impl Opener {
    #[new]
    fn new(key: &[u8]) -> Self {
        Opener {
            inner: sealing::Opener::new(key),
            plain: Vec::new(),
            serving: None,
            answers: None,
        }
    }

    /// The payload bytes completed by `data` (`b""` while a frame is partial); raises
    /// `FrameError` on a tag that does not verify or an oversized frame.
    fn feed<'py>(&mut self, py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        self.plain.clear();
        self.inner
            .feed(data, &mut self.plain)
            .map_err(|e| FrameError::new_err(e.to_string()))?;
        let plain = PyBytes::new(py, &self.plain);
        if self.plain.capacity() > 64 * 1024 {
            self.plain = Vec::new();
        }
        Ok(plain)
    }

    /// Make `feed_requests` parse what it opens as the replica's server does
    /// (`parse_request`'s rules: see `request.rs`), each request made by
    /// `make(method, path, query, headers, body, keep_alive, False, request_id, model_id)`; a
    /// path starting with `stop_prefix` (when not empty) is left to httptools; `make_ids`: a
    /// request without an `X-Request-Id` gets a new one.
    #[pyo3(signature = (make, max_url, max_head, max_body, stop_prefix, make_ids))]
    fn serve_requests(
        &mut self,
        make: Py<PyAny>,
        max_url: usize,
        max_head: usize,
        max_body: i64,
        stop_prefix: &[u8],
        make_ids: bool,
    ) {
        let rules = request::Rules {
            max_url,
            max_head,
            max_body,
            stop_prefix: stop_prefix.to_vec(),
            make_ids,
        };
        self.serving = Some((rules, make));
    }

    /// `feed`, then the whole common requests at the start of what it opened, made (see
    /// `serve_requests`): `(requests, rest)`, `rest` the opened bytes after them (``b""`` when
    /// none), for httptools. Raises `FrameError` as `feed` does.
    fn feed_requests<'py>(
        &mut self,
        py: Python<'py>,
        data: &[u8],
    ) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyBytes>)> {
        self.plain.clear();
        self.inner
            .feed(data, &mut self.plain)
            .map_err(|e| FrameError::new_err(e.to_string()))?;
        let Some((rules, make)) = &self.serving else {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(
                "feed_requests before serve_requests",
            ));
        };
        let requests = PyList::empty(py);
        let mut start = 0;
        while let Some(p) = request::parse_at(py, &self.plain, start, rules)? {
            start = p.end;
            let args = PyTuple::new(
                py,
                [
                    p.method,
                    p.path,
                    p.query,
                    p.headers,
                    p.body,
                    p.keep_alive,
                    pyo3::types::PyBool::new(py, false).to_owned().into_any(),
                    p.request_id,
                    p.model_id,
                ],
            )?;
            requests.append(make.bind(py).call1(args)?)?;
        }
        let rest = PyBytes::new(py, &self.plain[start..]);
        if self.plain.capacity() > 64 * 1024 {
            self.plain = Vec::new();
        }
        Ok((requests, rest))
    }

    /// Make `feed_answer` read the `unserved` and `models` headers (lowercase names) besides
    /// the length (see `response.rs`).
    fn serve_answers(&mut self, unserved: &[u8], models: &[u8]) {
        self.answers = Some(response::AnswerNames {
            unserved: unserved.to_vec(),
            models: models.to_vec(),
        });
    }

    /// `feed`, then the answer the opened bytes are, when they are exactly one common answer:
    /// `(answer, b"")`, `answer` = `(status, body, keep_alive, unserved, models)`; else
    /// `(None, opened)` for httptools. Raises `FrameError` as `feed` does.
    fn feed_answer<'py>(
        &mut self,
        py: Python<'py>,
        data: &[u8],
    ) -> PyResult<(Option<Bound<'py, PyTuple>>, Bound<'py, PyBytes>)> {
        self.plain.clear();
        self.inner
            .feed(data, &mut self.plain)
            .map_err(|e| FrameError::new_err(e.to_string()))?;
        let Some(names) = &self.answers else {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(
                "feed_answer before serve_answers",
            ));
        };
        let answer = if self.plain.is_empty() {
            None
        } else {
            response::parse_answer(py, &self.plain, names)?
        };
        let rest = if answer.is_some() {
            PyBytes::new(py, b"")
        } else {
            PyBytes::new(py, &self.plain)
        };
        if self.plain.capacity() > 64 * 1024 {
            self.plain = Vec::new();
        }
        Ok((answer, rest))
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Sealer>()?;
    m.add_class::<Opener>()?;
    m.add_class::<tally::Tally>()?;
    m.add_function(wrap_pyfunction!(request::parse_request, m)?)?;
    m.add_function(wrap_pyfunction!(answer::answer, m)?)?;
    m.add_function(wrap_pyfunction!(send::send_now, m)?)?;
    m.add("FrameError", m.py().get_type::<FrameError>())?;
    m.add("MAX_FRAME", sealing::MAX_FRAME)?;
    m.add("TAG_SIZE", sealing::TAG_SIZE)?;
    m.add("SMALL_FRAME", sealing::SMALL_FRAME)?;
    m.add("MAX_ACCESS_LINES", tally::MAX_ACCESS_LINES)?;
    Ok(())
}
