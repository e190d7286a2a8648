//! A write to a replica connection's socket that keeps the GIL: how a worker thread answers a
//! sync request itself (`kubeserve/runtime/replica/ingress.py`, `_PlainAnswer`).

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;

/// Writes what the non-blocking socket `fd` takes of `data` now, in one `send` (`MSG_NOSIGNAL`),
/// and returns how many bytes that was (0 when its buffer is full). The GIL is held throughout,
/// on purpose: the event loop that owns the socket closes it only with the GIL, so the
/// descriptor cannot be closed (and its number given to another connection) mid-write.
#[pyfunction]
pub fn send_now(fd: i32, data: &[u8]) -> PyResult<usize> {
    loop {
        // SAFETY: `data` is a live buffer of `data.len()` bytes; `send` reads no more.
        let sent = unsafe {
            libc::send(fd, data.as_ptr().cast::<libc::c_void>(), data.len(), libc::MSG_NOSIGNAL)
        };
        if sent >= 0 {
            return Ok(sent as usize);
        }
        let err = std::io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(code) if code == libc::EAGAIN || code == libc::EWOULDBLOCK => return Ok(0),
            _ => return Err(PyOSError::new_err(err.to_string())),
        }
    }
}
