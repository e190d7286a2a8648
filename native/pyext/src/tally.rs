//! `Tally`: what a replica's finished requests leave for its metrics and its access log, kept in
//! compiled code and taken in batches (`kubeserve/runtime/replica/tally.py` is the same in
//! Python, the fallback and the reference: both give the same values and the same lines).
//!
//! A request's end is one call (`done`) that allocates no Python object: its latency goes into
//! the count, sum and histogram bucket of its route, and its access line's fields into a buffer.
//! Every flush takes the per-route batches (`take_metrics`) and the lines: TEXT lines formatted
//! here into one string (`take_text`), or the entries as tuples for the JSON formatter
//! (`take_entries`).

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use pyo3::prelude::*;
use pyo3::types::{PyInt, PyList, PyString, PyTuple};

/// Requests of one route since the last `take_metrics`.
struct Pending {
    route: String,
    count: u64,
    total_ms: f64,
    buckets: Vec<u64>,
}

/// One access line's fields.
struct Entry {
    at: f64,
    method: String,
    route: String,
    status: Status,
    latency_ms: f64,
    request_id: String,
    route_field: String,
}

enum Status {
    Code(i64),
    Word(String),
}

#[pyclass(module = "kubeserve._native")]
pub struct Tally {
    /// the upper bounds of the latency buckets (ms), ascending; one more bucket for +Inf
    bounds: Vec<f64>,
    pending: Vec<Pending>,
    entries: Vec<Entry>,
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
            entries: Vec::new(),
            dirty: false,
        }
    }

    /// A request or handle call that began at `started` ended at `now` (both
    /// `time.perf_counter()`): counted under `route`; with `method` (not None), its access line
    /// `METHOD ROUTE STATUS LATENCYms` (`access_route` its route, `request_id` and
    /// `route_field` its record's fields). Returns whether this is the first record since the
    /// last take (the caller schedules a flush then).
    #[pyo3(signature = (started, now, route, method=None, access_route="", status=None, request_id="", route_field=""))]
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
            let status = match status {
                Some(s) if s.is_instance_of::<PyInt>() => Status::Code(s.extract()?),
                Some(s) => Status::Word(s.str()?.to_str()?.to_owned()),
                None => Status::Word("None".to_owned()),
            };
            self.entries.push(Entry {
                at: now_unix(),
                method: method.to_owned(),
                route: access_route.to_owned(),
                status,
                latency_ms,
                request_id: request_id.to_owned(),
                route_field: route_field.to_owned(),
            });
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
        self.entries.len()
    }

    /// The waiting access lines as TEXT, in one string:
    /// `<stamp>,<ms> <who><request id> -- <message>` (`<who>` is ` <component> <id> `), the
    /// stamp of each second asked once of `stamp(second)` (`INFO <asctime without ms>`).
    fn take_text(&mut self, stamp: &Bound<'_, PyAny>, who: &str) -> PyResult<String> {
        let mut out = String::with_capacity(self.entries.len() * (100 + who.len()));
        let mut second = i64::MIN;
        let mut stamped = String::new();
        for e in self.entries.drain(..) {
            let whole = e.at.floor() as i64;
            if whole != second {
                second = whole;
                stamped = stamp.call1((whole,))?.extract()?;
            }
            let millis = ((e.at - whole as f64) * 1000.0) as i64;
            let _ = write!(out, "{stamped},{millis:03}{who}");
            if !e.request_id.is_empty() {
                out.push_str(&e.request_id);
                out.push(' ');
            }
            let _ = write!(out, "-- {} {} ", e.method, e.route);
            match &e.status {
                Status::Code(c) => {
                    let _ = write!(out, "{c}");
                }
                Status::Word(w) => out.push_str(w),
            }
            let _ = writeln!(out, " {:.1}ms", e.latency_ms);
        }
        Ok(out)
    }

    /// The waiting access lines as `(at, method, route, status, latency_ms, request_id,
    /// route_field)` tuples (`kubeserve.runtime.logs`' entries, for its JSON lines).
    fn take_entries<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for e in self.entries.drain(..) {
            let status = match e.status {
                Status::Code(c) => c.into_pyobject(py)?.into_any(),
                Status::Word(w) => PyString::new(py, &w).into_any(),
            };
            list.append(PyTuple::new(
                py,
                [
                    e.at.into_pyobject(py)?.into_any(),
                    PyString::new(py, &e.method).into_any(),
                    PyString::new(py, &e.route).into_any(),
                    status,
                    e.latency_ms.into_pyobject(py)?.into_any(),
                    PyString::new(py, &e.request_id).into_any(),
                    PyString::new(py, &e.route_field).into_any(),
                ],
            )?)?;
        }
        Ok(list)
    }
}
