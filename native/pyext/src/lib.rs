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

use pyo3::buffer::PyBuffer;
use pyo3::create_exception;
use pyo3::exceptions::PyConnectionError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

mod answer;
mod request;
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
}

#[pymethods]
impl Opener {
    #[new]
    fn new(key: &[u8]) -> Self {
        Opener {
            inner: sealing::Opener::new(key),
            plain: Vec::new(),
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
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Sealer>()?;
    m.add_class::<Opener>()?;
    m.add_class::<tally::Tally>()?;
    m.add_function(wrap_pyfunction!(request::parse_request, m)?)?;
    m.add_function(wrap_pyfunction!(answer::answer, m)?)?;
    m.add("FrameError", m.py().get_type::<FrameError>())?;
    m.add("MAX_FRAME", sealing::MAX_FRAME)?;
    m.add("TAG_SIZE", sealing::TAG_SIZE)?;
    m.add("SMALL_FRAME", sealing::SMALL_FRAME)?;
    m.add("MAX_ACCESS_LINES", tally::MAX_ACCESS_LINES)?;
    Ok(())
}
