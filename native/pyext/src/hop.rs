//! The thread hop's wake-ups (`kubeserve/runtime/thread_hop.py`) without the GIL in between.
//!
//! A worker thread of the hop that runs out of calls must tell the event loop its results are
//! in, then sleep until given more work. In Python that is two calls that each release and
//! retake the GIL: the wake-up (the loop, woken, then waits for the GIL the worker holds) and
//! the sleep. `Sleeper.sleep(fd)` releases the GIL once, writes the wake-up to `fd` (an
//! eventfd the loop reads, registered with `loop.add_reader`), and sleeps, without taking the
//! GIL back in between: the loop, woken, finds the GIL free.
//!
//! A `Sleeper` is made by the worker thread that sleeps on it, and woken by any thread with
//! `wake()` (with the GIL held: an atomic store, and one futex wake only when the worker is
//! parked). A wake before the sleep is kept (the next sleep returns at once): none is lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::Thread;

use pyo3::prelude::*;

/// One worker thread's sleep: woken by `wake()`, from any thread.
#[pyclass(module = "kubeserve._native", frozen)]
pub struct Sleeper {
    woken: AtomicBool,
    thread: Thread,
}

#[pymethods]
impl Sleeper {
    /// A sleeper for the calling thread (only that thread may `sleep` on it).
    #[new]
    fn new() -> Self {
        Sleeper {
            woken: AtomicBool::new(false),
            thread: std::thread::current(),
        }
    }

    /// Write the 8-byte eventfd increment 1 to `fd` (none when `fd` is negative), then sleep
    /// until woken (at once when a `wake()` came since the last sleep); the GIL is released
    /// from before the write until woken.
    #[pyo3(signature = (fd = -1))]
    fn sleep(&self, py: Python<'_>, fd: i32) -> PyResult<()> {
        let woken = &self.woken;
        let written = py.allow_threads(|| {
            let written = if fd >= 0 { write_one(fd) } else { Ok(()) };
            // The sleeping thread is `self.thread` (checked in debug builds): a park token
            // left by a wake() that came before the park makes the park return at once.
            debug_assert_eq!(std::thread::current().id(), self.thread.id());
            while !woken.swap(false, Ordering::AcqRel) {
                std::thread::park();
            }
            written
        });
        written.map_err(PyErr::from)
    }

    /// Wake the sleeper (now, or its next sleep returns at once).
    fn wake(&self) {
        self.woken.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

fn write_one(fd: i32) -> std::io::Result<()> {
    let one: u64 = 1;
    loop {
        // SAFETY: writes 8 bytes from a live u64 to a file descriptor the caller owns.
        let n = unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
        if n >= 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        match err.kind() {
            std::io::ErrorKind::Interrupted => continue,
            // an eventfd's counter at its maximum: the reader has a wake-up pending anyway
            std::io::ErrorKind::WouldBlock => return Ok(()),
            _ => return Err(err),
        }
    }
}

/// Write the eventfd increment 1 to `fd`, with the GIL held (a worker that goes on working).
#[pyfunction]
pub fn notify_fd(fd: i32) -> PyResult<()> {
    write_one(fd).map_err(PyErr::from)
}

/// Read (and so reset) the non-blocking eventfd `fd`, with the GIL held; whether it had been
/// written to.
#[pyfunction]
pub fn clear_fd(fd: i32) -> PyResult<bool> {
    let mut count: u64 = 0;
    loop {
        // SAFETY: reads at most 8 bytes into a live u64 from a file descriptor the caller owns.
        let n = unsafe { libc::read(fd, (&mut count as *mut u64).cast(), 8) };
        if n >= 0 {
            return Ok(n > 0);
        }
        let err = std::io::Error::last_os_error();
        match err.kind() {
            std::io::ErrorKind::Interrupted => continue,
            std::io::ErrorKind::WouldBlock => return Ok(false),
            _ => return Err(err.into()),
        }
    }
}
