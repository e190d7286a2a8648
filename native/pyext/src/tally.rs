//! `Tally`: what a replica's finished requests leave for its metrics and its access log, kept in
//! compiled code and taken in batches (`kubeserve/runtime/replica/tally.py` is the same in
//! Python, the fallback and the reference: both give the same values and the same lines).
//!
//! A request's end is one call (`done`) that allocates no Python object: its latency goes into
//! the count, sum and histogram bucket of its route, and its access line is formatted at once,
//! by the proxy's own formatter (`native/src/access.rs`, included here), into one buffer that is
//! reused from flush to flush: no per-request record is kept. Every flush takes the per-route
//! batches (`take_metrics`) and the lines as one `bytes` block (`take_lines`), which the log
//! writes as it is.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyList, PyString, PyTuple};

#[allow(dead_code)] // `add` and `take` serve the proxy only
#[path = "../../src/access.rs"]
mod access;

/// Requests of one route since the last `take_metrics`.
struct Pending {
    route: String,
    count: u64,
    total_ms: f64,
    buckets: Vec<u64>,
}

/// An access line's status as Python's `%s` writes it: an `int`'s digits, else its `str()`.
enum Status<'py> {
    Code(i64),
    Word(Bound<'py, PyString>),
    None,
}

impl fmt::Display for Status<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Status::Code(c) => write!(f, "{c}"),
            Status::Word(w) => f.write_str(&w.to_string_lossy()),
            Status::None => f.write_str("None"),
        }
    }
}

#[pyclass(module = "kubeserve._native")]
pub struct Tally {
    /// the upper bounds of the latency buckets (ms), ascending; one more bucket for +Inf
    bounds: Vec<f64>,
    pending: Vec<Pending>,
    /// the access lines since the last `take_lines`, formatted (off until `access_format`)
    lines: access::AccessLines,
    /// something was recorded since the last take of both kinds
    dirty: bool,
}

/// `bisect.bisect_left(bounds, value)`.
fn bucket(bounds: &[f64], value: f64) -> usize {
    bounds.partition_point(|&b| b < value)
}

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[pymethods]
impl Tally {
    #[new]
    fn new(bounds: Vec<f64>) -> Self {
        Tally {
            bounds,
            pending: Vec::new(),
            lines: access::AccessLines::default(),
            dirty: false,
        }
    }

    /// The format of the access lines from now on: `AccessLog.native_format()`'s (`json`:
    /// JSON lines, else TEXT; `component`: the component's part of each line in its final
    /// form). Until it is given, `done` keeps no line.
    fn access_format(&mut self, json: bool, component: &str) {
        self.lines.set_format(Some((json, component)));
    }

    /// A request or handle call that began at `started` ended at `now` (both
    /// `time.perf_counter()`): counted under `route`; with `method` (not None), its access line
    /// `METHOD ROUTE STATUS LATENCYms` (`access_route` its route, `request_id` and
    /// `route_field` its line's fields; `at` when it ended, `time.time()`, if not now).
    /// Returns whether this is the first record since the last take (the caller schedules a
    /// flush then).
    #[pyo3(signature = (started, now, route, method=None, access_route="", status=None, request_id="", route_field="", at=None))]
    #[allow(clippy::too_many_arguments)]
    fn done(
        &mut self,
        started: f64,
        now: f64,
        route: &str,
        method: Option<&str>,
        access_route: &str,
        status: Option<&Bound<'_, PyAny>>,
        request_id: &str,
        route_field: &str,
        at: Option<f64>,
    ) -> PyResult<bool> {
        let latency_ms = (now - started) * 1000.0;
        let index = bucket(&self.bounds, latency_ms);
        let slot = match self.pending.iter().position(|p| p.route == route) {
            Some(i) => i,
            None => {
                self.pending.push(Pending {
                    route: route.to_owned(),
                    count: 0,
                    total_ms: 0.0,
                    buckets: vec![0; self.bounds.len() + 1],
                });
                self.pending.len() - 1
            }
        };
        let pending = &mut self.pending[slot];
        pending.count += 1;
        pending.total_ms += latency_ms;
        pending.buckets[index] += 1;
        if let Some(method) = method {
            if self.lines.on() {
                let status = match status {
                    Some(s) if s.is_exact_instance_of::<PyInt>() => Status::Code(s.extract()?),
                    Some(s) => Status::Word(s.str()?),
                    None => Status::None,
                };
                let at = at.unwrap_or_else(now_unix);
                self.lines.add_routed(
                    at,
                    method,
                    access_route,
                    status,
                    latency_ms,
                    request_id,
                    route_field,
                );
            }
        }
        let first = !self.dirty;
        self.dirty = true;
        Ok(first)
    }

    /// The batches since the last take: `[(route, count, total_ms, buckets)]`, `buckets` one
    /// count per bound and then +Inf.
    fn take_metrics<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.dirty = false;
        let list = PyList::empty(py);
        for p in self.pending.drain(..) {
            let buckets = PyList::new(py, &p.buckets)?;
            list.append(PyTuple::new(
                py,
                [
                    PyString::new(py, &p.route).into_any(),
                    p.count.into_pyobject(py)?.into_any(),
                    p.total_ms.into_pyobject(py)?.into_any(),
                    buckets.into_any(),
                ],
            )?)?;
        }
        Ok(list)
    }

    /// How many access lines wait.
    fn lines(&self) -> usize {
        self.lines.lines()
    }

    /// The waiting access lines, UTF-8, each ending in a newline, and how many were dropped
    /// since the last take (over `MAX_ACCESS_LINES` waiting).
    fn take_lines<'py>(&mut self, py: Python<'py>) -> (Bound<'py, PyBytes>, u64) {
        let block = PyBytes::new(py, self.lines.pending());
        (block, self.lines.clear())
    }
}

/// Most access lines held between two takes: past it they are counted and dropped.
pub const MAX_ACCESS_LINES: usize = access::MAX_ACCESS;
