//! Access lines, formatted here exactly as `kubeserve.runtime.logs.AccessLog` writes its own
//! (Ray's TEXT or JSON line, byte for byte), and held as one text until it is taken: the Python
//! proxy (after a `take_records`) or a replica (`native/pyext/src/tally.rs`, which includes this
//! file) writes that text in one write through its rotating log, with no Python object per
//! request (a list per request cost the proxy ~3.5 us of CPU and megabytes of transient memory
//! under load). One writer of the log file stays: the Python process, with its rotation and size
//! limit.
//!
//! What only Python knows is given with `set_format` (`AccessLog.native_format`; the proxy's
//! `state` op, `routing.rs`): the encoding and the component's part of each line, already in its
//! final form. This file needs no crate but `libc`, so the extension can include it. What varies per request
//! (time, method, route, status, latency, request id) is formatted here as Python's `%` and
//! `json.dumps` format it: `%.1f` of the latency (Rust's `{:.1}` rounds the same, exactly),
//! milliseconds truncated, the local time of the whole second, `ensure_ascii` escapes.

use std::fmt::{Display, Write as _};
use std::io::Write;

/// Most access lines held between two takes (one every 0.1 s); past it they are counted, dropped.
/// A line is bounded (a method within the head limit, a request id of at most 128 characters).
pub const MAX_ACCESS: usize = 200_000;

/// The Python process's line format, as `AccessLog.native_format` gives it.
struct Format {
    json: bool,
    /// TEXT: ` <component name> <component id> `; JSON: the component's fields as
    /// `json.dumps` writes them, `"filename": ...` to `"component_type": ...`
    component: String,
}

/// The access lines of one front (HTTP or gRPC) since the last take.
#[derive(Default)]
pub struct AccessLines {
    /// None: access lines are off (`logging_config.enable_access_log`)
    format: Option<Format>,
    text: Vec<u8>,
    lines: usize,
    dropped: u64,
    /// the whole second `stamp` is of (local time, `%Y-%m-%d %H:%M:%S`), formatted once a second
    second: i64,
    stamp: String,
    /// a JSON line's message before its escaping (reused)
    message: String,
}

/// Past this, the text's buffer is not kept between two takes (a burst's).
#[allow(dead_code)] // with `lines`, `pending` and `clear`: the replica tally's (pyext)
const KEPT_CAPACITY: usize = 256 * 1024;

impl AccessLines {
    pub fn on(&self) -> bool {
        self.format.is_some()
    }

    /// Access lines on in this format (`json`: JSON lines, else TEXT; `component`: the
    /// component's part of each line, see `Format`), or off (None: nothing is kept).
    pub fn set_format(&mut self, format: Option<(bool, &str)>) {
        self.format = format.map(|(json, component)| Format {
            json,
            component: component.to_owned(),
        });
    }

    /// One line: ``METHOD ROUTE STATUS LATENCYms`` answered at `at` (seconds since the epoch),
    /// with its request id (none: empty) and route (also the JSON line's `route`; none: empty).
    pub fn add(
        &mut self,
        at: f64,
        method: &str,
        route: &str,
        status: impl Display,
        latency_ms: f64,
        rid: &str,
    ) {
        self.add_routed(at, method, route, status, latency_ms, rid, route);
    }

    /// `add` with the JSON line's `route` given apart from the message's (a replica's handle
    /// call names its method in the message, the request's route in the field).
    #[allow(clippy::too_many_arguments)]
    pub fn add_routed(
        &mut self,
        at: f64,
        method: &str,
        route: &str,
        status: impl Display,
        latency_ms: f64,
        rid: &str,
        route_field: &str,
    ) {
        let Some(format) = &self.format else { return };
        if self.lines >= MAX_ACCESS {
            self.dropped += 1;
            return;
        }
        self.lines += 1;
        let whole = at.trunc();
        let millis = ((at - whole) * 1000.0) as i64;
        if whole as i64 != self.second || self.stamp.is_empty() {
            self.second = whole as i64;
            self.stamp = local_stamp(self.second);
        }
        let out = &mut self.text;
        if !format.json {
            let _ = write!(out, "INFO {},{millis:03}{}", self.stamp, format.component);
            if !rid.is_empty() {
                out.extend_from_slice(rid.as_bytes());
                out.push(b' ');
            }
            let _ = writeln!(out, "-- {method} {route} {status} {latency_ms:.1}ms");
            return;
        }
        let _ = write!(out, "{{\"asctime\": \"{},{millis:03}\", ", self.stamp);
        out.extend_from_slice(b"\"levelname\": \"INFO\", \"message\": ");
        self.message.clear();
        let _ = write!(self.message, "{method} {route} {status} {latency_ms:.1}ms");
        python_json_str(out, &self.message);
        out.extend_from_slice(b", ");
        out.extend_from_slice(format.component.as_bytes());
        if !rid.is_empty() {
            out.extend_from_slice(b", \"request_id\": ");
            python_json_str(out, rid);
        }
        if !route_field.is_empty() {
            out.extend_from_slice(b", \"route\": ");
            python_json_str(out, route_field);
        }
        out.extend_from_slice(b"}\n");
    }

    /// How many lines wait.
    #[allow(dead_code)]
    pub fn lines(&self) -> usize {
        self.lines
    }

    /// The lines since the last take (`clear` takes them).
    #[allow(dead_code)]
    pub fn pending(&self) -> &[u8] {
        &self.text
    }

    /// Take the lines `pending` gave, keeping their buffer for the next ones (up to
    /// `KEPT_CAPACITY`); returns how many were dropped over `MAX_ACCESS` since the last take.
    #[allow(dead_code)]
    pub fn clear(&mut self) -> u64 {
        self.lines = 0;
        if self.text.capacity() > KEPT_CAPACITY {
            self.text = Vec::new();
        } else {
            self.text.clear();
        }
        std::mem::take(&mut self.dropped)
    }

    /// The lines since the last take, and how many were dropped over `MAX_ACCESS`.
    pub fn take(&mut self) -> (Vec<u8>, u64) {
        self.lines = 0;
        (
            std::mem::take(&mut self.text),
            std::mem::take(&mut self.dropped),
        )
    }
}

/// `time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))`: this process's local time
/// (the Python proxy's environment, `TZ` included, is its parent's).
fn local_stamp(second: i64) -> String {
    let t = second as libc::time_t;
    // SAFETY: localtime_r writes only into the `tm` it is given; an all-zero `tm` is valid
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return "1970-01-01 00:00:00".to_owned();
    }
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

/// A JSON string as Python's `json.dumps` (`ensure_ascii`) writes it: `"` and `\` escaped,
/// `\b \f \n \r \t` short, every other character outside `' '..='~'` as `\uXXXX` (lower-case
/// hex; past the BMP, a surrogate pair).
fn python_json_str(out: &mut Vec<u8>, text: &str) {
    out.push(b'"');
    for c in text.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            '\u{8}' => out.extend_from_slice(b"\\b"),
            '\u{c}' => out.extend_from_slice(b"\\f"),
            ' '..='~' => out.push(c as u8),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
        }
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(json: bool, component: &str) -> AccessLines {
        let mut a = AccessLines::default();
        a.set_format(Some((json, component)));
        a
    }

    /// Expected lines below are what `kubeserve.runtime.logs.AccessLog` writes for the same
    /// entries (generated with it, TZ=UTC); the Python side checks the whole path
    /// (tests/runtime/test_fastpath.py).
    #[test]
    fn text_lines_read_as_the_python_proxys() {
        std::env::set_var("TZ", "UTC");
        let mut a = lines(false, " proxy node-1 ");
        a.add(1_795_000_000.001_5, "GET", "/echo", 200, 0.25, "0123abcd");
        a.add(1_795_000_000.999_9, "POST", "/", 503, 1234.55, "");
        a.add(1_795_000_001.5, "GET", "/", "OK", 0.05, "r");
        let (text, dropped) = a.take();
        assert_eq!(dropped, 0);
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "INFO 2026-11-18 11:06:40,001 proxy node-1 0123abcd -- GET /echo 200 0.2ms\n\
             INFO 2026-11-18 11:06:40,999 proxy node-1 -- POST / 503 1234.5ms\n\
             INFO 2026-11-18 11:06:41,500 proxy node-1 r -- GET / OK 0.1ms\n"
        );
        assert_eq!(a.take().0, b"");
    }

    #[test]
    fn json_lines_escape_as_python_json_dumps() {
        std::env::set_var("TZ", "UTC");
        let component = "\"filename\": \"proxy\", \"lineno\": 0, \"component_name\": \"proxy\", \
                         \"component_id\": \"n\", \"component_type\": \"proxy\"";
        let mut a = lines(true, component);
        a.add(
            1_795_000_000.25,
            "G\u{e9}T\"\\\u{7f}\u{1F600}\t",
            "/a",
            200,
            1.0,
            "id",
        );
        a.add(1_795_000_000.25, "GET", "", 200, 1.0, "");
        let (text, _) = a.take();
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "{\"asctime\": \"2026-11-18 11:06:40,250\", \"levelname\": \"INFO\", \
             \"message\": \"G\\u00e9T\\\"\\\\\\u007f\\ud83d\\ude00\\t /a 200 1.0ms\", \
             \"filename\": \"proxy\", \"lineno\": 0, \"component_name\": \"proxy\", \
             \"component_id\": \"n\", \"component_type\": \"proxy\", \"request_id\": \"id\", \
             \"route\": \"/a\"}\n\
             {\"asctime\": \"2026-11-18 11:06:40,250\", \"levelname\": \"INFO\", \
             \"message\": \"GET  200 1.0ms\", \"filename\": \"proxy\", \"lineno\": 0, \
             \"component_name\": \"proxy\", \"component_id\": \"n\", \
             \"component_type\": \"proxy\"}\n"
        );
    }

    #[test]
    fn off_keeps_nothing() {
        let mut a = lines(false, " p n ");
        a.set_format(None);
        a.add(1.0, "GET", "/", 200, 1.0, "");
        assert!(!a.on() && a.take().0.is_empty());
    }

    #[test]
    fn a_route_field_apart_from_the_message_and_a_kept_buffer() {
        std::env::set_var("TZ", "UTC");
        let mut a = lines(true, "\"lineno\": 0");
        a.add_routed(1_795_000_000.5, "CALL", "greet", "OK", 2.0, "", "/b");
        assert_eq!(
            std::str::from_utf8(a.pending()).unwrap(),
            "{\"asctime\": \"2026-11-18 11:06:40,500\", \"levelname\": \"INFO\", \
             \"message\": \"CALL greet OK 2.0ms\", \"lineno\": 0, \"route\": \"/b\"}\n"
        );
        assert_eq!((a.lines(), a.clear()), (1, 0));
        assert!(a.pending().is_empty() && a.text.capacity() > 0 && a.lines() == 0);
    }

    #[test]
    fn past_the_limit_lines_are_counted_and_dropped() {
        let mut a = lines(false, " p n ");
        for _ in 0..MAX_ACCESS + 3 {
            a.add(1.0, "GET", "/", 200, 1.0, "");
        }
        let (text, dropped) = a.take();
        assert_eq!(
            (text.iter().filter(|&&b| b == b'\n').count(), dropped),
            (MAX_ACCESS, 3)
        );
    }
}
