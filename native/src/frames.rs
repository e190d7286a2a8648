//! The body of a streamed handle call's answer (`/-/stream/<method>`), cut as it arrives: HTTP/1.1
//! chunked transfer coding around the frames of `kubeserve.runtime.wire` (kind (1 byte), payload
//! length (4, big-endian), payload). Pure logic, no I/O: `grpc.rs` feeds it what the replica sent
//! and takes pieces out, so that a message the method yields passes through in pieces (never
//! held whole) and what is held per stream is bounded.

use crate::http::ChunkScanner;

/// The largest chunk a streamed answer may announce (2 GiB).
const MAX_CHUNK: u64 = 1 << 31;

/// Decodes chunked transfer coding incrementally: `http::ChunkScanner`'s framing (and refusals),
/// keeping the chunk data.
pub struct Dechunker {
    scanner: ChunkScanner,
}

impl Default for Dechunker {
    fn default() -> Self {
        Dechunker {
            scanner: ChunkScanner::with_max_chunk(MAX_CHUNK),
        }
    }
}

impl Dechunker {
    /// Append the body bytes of `data` to `out`; Err on bad coding or on bytes after the body's
    /// end (the connection is out of step); Ok(true) once the body ended.
    pub fn feed(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<bool, ()> {
        match self
            .scanner
            .feed_with(data, |run| out.extend_from_slice(run))?
        {
            Some(end) if end == data.len() => Ok(true),
            Some(_) => Err(()),
            None => Ok(false),
        }
    }
}

/// One piece of the frames, as `FrameCutter::next` hands them out.
#[derive(Debug, PartialEq)]
pub enum Piece {
    /// an item frame whose payload is a bare message (`M`): the message's length, its bytes
    /// following as `Bytes` pieces
    MessageStart(usize),
    /// bytes of the current message
    Bytes(Vec<u8>),
    /// a whole frame Python reads (an item with a changed context `C`, an error `E`)
    Whole(u8, Vec<u8>),
    /// the end frame (`D`)
    End,
}

/// Cuts the dechunked body into pieces; holds at most one frame header, or one whole frame of
/// the kinds Python reads (bounded by `max_whole`).
pub struct FrameCutter {
    buf: Vec<u8>,
    /// bytes of the current message still to pass through
    passing: usize,
    max_whole: usize,
}

impl FrameCutter {
    pub fn new(max_whole: usize) -> FrameCutter {
        FrameCutter {
            buf: Vec::new(),
            passing: 0,
            max_whole,
        }
    }

    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next piece, Ok(None) when more bytes are needed, Err on a malformed or oversized frame.
    pub fn next(&mut self) -> Result<Option<Piece>, &'static str> {
        if self.passing > 0 {
            if self.buf.is_empty() {
                return Ok(None);
            }
            let n = self.passing.min(self.buf.len());
            self.passing -= n;
            let rest = self.buf.split_off(n);
            return Ok(Some(Piece::Bytes(std::mem::replace(&mut self.buf, rest))));
        }
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let kind = self.buf[0];
        let len = u32::from_be_bytes(self.buf[1..5].try_into().unwrap()) as usize;
        match kind {
            b'D' => {
                if len != 0 {
                    return Err("an end frame with a payload");
                }
                self.buf.drain(..5);
                Ok(Some(Piece::End))
            }
            b'I' if len >= 1 && self.buf.len() >= 6 && self.buf[5] == b'M' => {
                self.buf.drain(..6);
                self.passing = len - 1;
                Ok(Some(Piece::MessageStart(len - 1)))
            }
            b'I' | b'E' => {
                if len == 0 && kind == b'I' {
                    return Err("an empty item frame");
                }
                if kind == b'I' && self.buf.len() < 6 {
                    return Ok(None);
                }
                if len > self.max_whole {
                    return Err("a frame larger than the native front holds");
                }
                if self.buf.len() < 5 + len {
                    return Ok(None);
                }
                let rest = self.buf.split_off(5 + len);
                let mut frame = std::mem::replace(&mut self.buf, rest);
                frame.drain(..5);
                Ok(Some(Piece::Whole(kind, frame)))
            }
            _ => Err("an unknown frame kind"),
        }
    }
}

/// The `grpc-timeout` header's duration (gRPC over HTTP/2: up to 8 digits and a unit).
pub fn grpc_timeout(value: &[u8]) -> Option<std::time::Duration> {
    use std::time::Duration;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b"H" => Duration::from_secs(n * 3600),
        b"M" => Duration::from_secs(n * 60),
        b"S" => Duration::from_secs(n),
        b"m" => Duration::from_millis(n),
        b"u" => Duration::from_micros(n),
        b"n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// gRPC's status code names (as `grpc.StatusCode` names them in Ray's metrics).
pub fn code_name(code: u32) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    NAMES.get(code as usize).copied().unwrap_or("UNKNOWN")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![kind];
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn dechunks_across_any_split() {
        let body = b"5\r\nhello\r\n3;x=y\r\nabc\r\n0\r\nX-T: 1\r\n\r\n";
        for cut in 0..=body.len() {
            let mut d = Dechunker::default();
            let mut out = Vec::new();
            let first = d.feed(&body[..cut], &mut out).unwrap();
            assert_eq!(first, cut == body.len());
            assert!(d.feed(&body[cut..], &mut out).unwrap());
            assert_eq!(out, b"helloabc");
            // after the end: nothing more is fine, any byte is out of step
            assert_eq!(d.feed(b"", &mut out), Ok(true));
            assert!(d.feed(b"x", &mut out).is_err());
        }
        let mut d = Dechunker::default();
        let mut out = Vec::new();
        for b in body {
            d.feed(&[*b], &mut out).unwrap();
        }
        assert_eq!(out, b"helloabc");
    }

    #[test]
    fn dechunker_refusals() {
        let cases: [&[u8]; 6] = [
            b"zz\r\n",
            b"\r\n\r\n",                   // no size digits
            b"3\r\nabcd\r\n",              // no CRLF after the data
            b"3;a\nb\r\nabc\r\n0\r\n\r\n", // a bare LF in an extension
            b"0\r\n\r\nX",                 // bytes after the end in the same read
            b"80000001\r\n",               // a chunk over 2 GiB
        ];
        for case in cases {
            for cut in 0..=case.len() {
                let mut d = Dechunker::default();
                let mut out = Vec::new();
                let refused = d.feed(&case[..cut], &mut out).is_err()
                    || d.feed(&case[cut..], &mut out).is_err();
                assert!(refused, "{:?} cut at {}", case, cut);
            }
        }
        let mut d = Dechunker::default();
        assert_eq!(d.feed(b"80000000\r\n", &mut Vec::new()), Ok(false));
    }

    #[test]
    fn cuts_messages_into_pieces_and_keeps_whole_frames() {
        let mut body = frame(b'I', b"Mhello");
        body.extend(frame(b'I', b"Cpickle"));
        body.extend(frame(b'D', b""));
        let mut c = FrameCutter::new(100);
        let mut got = Vec::new();
        for b in body {
            c.push(&[b]);
            while let Some(p) = c.next().unwrap() {
                got.push(p);
            }
        }
        assert_eq!(got[0], Piece::MessageStart(5));
        let message: Vec<u8> = got
            .iter()
            .filter_map(|p| match p {
                Piece::Bytes(b) => Some(b.clone()),
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(message, b"hello");
        assert!(got.contains(&Piece::Whole(b'I', b"Cpickle".to_vec())));
        assert_eq!(got.last(), Some(&Piece::End));
        let mut small = FrameCutter::new(3);
        small.push(&frame(b'E', b"toolong"));
        assert!(small.next().is_err());
    }

    #[test]
    fn grpc_timeouts() {
        assert_eq!(
            grpc_timeout(b"100m"),
            Some(std::time::Duration::from_millis(100))
        );
        assert_eq!(grpc_timeout(b"2S"), Some(std::time::Duration::from_secs(2)));
        assert_eq!(grpc_timeout(b"123456789S"), None);
        assert_eq!(grpc_timeout(b"S"), None);
        assert_eq!(code_name(4), "DEADLINE_EXCEEDED");
    }
}
