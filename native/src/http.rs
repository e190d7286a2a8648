//! HTTP/1.1 pieces of the fast path: which requests it covers, and where an answer ends.

/// What the fast path needs to know about a request it covers.
pub struct Plan {
    pub head_len: usize,
    pub content_length: usize,
    /// where the request line ends (after its `\n`): a generated request id goes there
    pub line_end: usize,
    /// the client sent a usable `x-request-id`
    pub has_id: bool,
    /// where its value is in the request (when `has_id`)
    pub id_start: usize,
    pub id_end: usize,
    /// the bytes of a `Connection: keep-alive` or `close` header line, not forwarded
    /// (hop-by-hop; the Python proxy drops it too); empty when there is none
    pub drop_start: usize,
    pub drop_end: usize,
    pub is_head: bool,
    /// `Connection: close`: the answer says `connection: close` and the connection ends after it
    pub close: bool,
    /// the request's `method` label in Ray's metrics (`metrics.METHOD_LABELS`)
    pub method: &'static str,
    /// the path, without the query string
    pub path_start: usize,
    pub path_end: usize,
}

pub enum Parsed {
    /// more bytes needed
    Partial,
    /// not for the fast path: hand the connection to the Python proxy
    NotCovered,
    Covered(Plan),
}

const METHOD_LABELS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

/// Hop-by-hop headers the fast path leaves to the Python proxy (`Connection` is looked at apart).
const HOP_BY_HOP: [&str; 7] = [
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
];

/// `http1.usable_request_id`: 1 to 128 of `[A-Za-z0-9._:@/+=~-]`.
fn usable_request_id(v: &[u8]) -> bool {
    !v.is_empty()
        && v.len() <= 128
        && v.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"._:@/+=~-".contains(c))
}

/// `routes.needs_normalizing`, plus what the Python proxy alone answers (`/-/`).
fn path_covered(path: &[u8]) -> bool {
    path.first() == Some(&b'/')
        && !path.starts_with(b"/-/")
        && path != b"/-"
        && !path.contains(&b'%')
        && !path.windows(2).any(|w| w == b"/." || w == b"//")
}

pub fn parse_request(buf: &[u8], max_body: usize, max_url: usize) -> Parsed {
    // (left uninitialised: httparse fills what it parses, no 2 KiB cleared per request)
    let mut headers = [const { std::mem::MaybeUninit::<httparse::Header>::uninit() }; 64];
    let mut req = httparse::Request::new(&mut []);
    let head_len = match req.parse_with_uninit_headers(buf, &mut headers) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::NotCovered,
    };
    if req.version != Some(1) {
        return Parsed::NotCovered;
    }
    let method = req.method.unwrap_or("");
    if method == "CONNECT" || method == "PRI" {
        return Parsed::NotCovered;
    }
    let target = req.path.unwrap_or("").as_bytes();
    if target.len() > max_url {
        return Parsed::NotCovered; // the Python proxy's 414
    }
    let path = match target.iter().position(|&c| c == b'?') {
        Some(q) => &target[..q],
        None => target,
    };
    if !path_covered(path) {
        return Parsed::NotCovered;
    }
    let mut content_length: Option<usize> = None;
    let mut has_id = false;
    let (mut id_start, mut id_end) = (0, 0);
    let (mut drop_start, mut drop_end) = (0, 0);
    let mut close = false;
    for h in req.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("content-length") {
            if content_length.is_some() || h.value.is_empty() || h.value.len() > 15 {
                return Parsed::NotCovered;
            }
            if !h.value.iter().all(u8::is_ascii_digit) {
                return Parsed::NotCovered;
            }
            let n: usize = std::str::from_utf8(h.value).unwrap().parse().unwrap();
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case("x-request-id") {
            if has_id || !usable_request_id(h.value) {
                return Parsed::NotCovered; // the Python proxy replaces it
            }
            has_id = true;
            id_start = h.value.as_ptr() as usize - buf.as_ptr() as usize;
            id_end = id_start + h.value.len();
        } else if name.eq_ignore_ascii_case("connection") {
            // HTTP/1.1 keeps alive anyway: the header says nothing, and is not forwarded; `close`
            // is not forwarded either (the replica connection is kept), the answer says it
            close = h.value.eq_ignore_ascii_case(b"close");
            if drop_end != 0 || !(close || h.value.eq_ignore_ascii_case(b"keep-alive")) {
                return Parsed::NotCovered;
            }
            drop_start = name.as_ptr() as usize - buf.as_ptr() as usize;
            let value_end = h.value.as_ptr() as usize - buf.as_ptr() as usize + h.value.len();
            match buf[value_end..head_len].iter().position(|&c| c == b'\n') {
                Some(n) => drop_end = value_end + n + 1,
                None => return Parsed::NotCovered,
            }
        } else if name.eq_ignore_ascii_case("serve_multiplexed_model_id")
            || HOP_BY_HOP.iter().any(|hop| name.eq_ignore_ascii_case(hop))
        {
            return Parsed::NotCovered;
        }
    }
    let content_length = content_length.unwrap_or(0);
    if content_length > max_body {
        return Parsed::NotCovered;
    }
    let line_end = buf.iter().position(|&c| c == b'\n').unwrap() + 1;
    // the path's offset in buf: the target follows the method and one space
    let path_start = method.len() + 1;
    Parsed::Covered(Plan {
        head_len,
        content_length,
        line_end,
        has_id,
        id_start,
        id_end,
        drop_start,
        drop_end,
        is_head: method == "HEAD",
        close,
        method: METHOD_LABELS
            .iter()
            .find(|m| **m == method)
            .copied()
            .unwrap_or("OTHER"),
        path_start,
        path_end: path_start + path.len(),
    })
}

/// How an answer's body ends.
pub enum Framing {
    Empty,
    Length(usize),
    Chunked,
    UntilClose,
}

pub struct Answer {
    pub head_len: usize,
    pub status: u16,
    pub framing: Framing,
    pub close: bool,
    /// the answer has a `Connection: close` header (`close` may come from the framing)
    pub said_close: bool,
    pub has_id: bool,
    pub unserved: bool,
    pub line_end: usize,
}

pub enum ParsedAnswer {
    Partial,
    Bad,
    Head(Answer),
}

pub fn parse_answer(buf: &[u8], request_is_head: bool) -> ParsedAnswer {
    let mut headers = [const { std::mem::MaybeUninit::<httparse::Header>::uninit() }; 64];
    let mut resp = httparse::Response::new(&mut []);
    let head_len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut resp,
        buf,
        &mut headers,
    ) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return ParsedAnswer::Partial,
        Err(_) => return ParsedAnswer::Bad,
    };
    let status = resp.code.unwrap_or(0);
    if status < 200 {
        return ParsedAnswer::Bad; // 1xx: never asked for (no Expect, no Upgrade)
    }
    let mut length = None;
    let mut chunked = false;
    let mut close = resp.version != Some(1);
    let mut has_id = false;
    let mut said_close = false;
    let mut unserved = false;
    for h in resp.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("content-length") {
            match std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
            {
                Some(n) if length.is_none() || length == Some(n) => length = Some(n),
                _ => return ParsedAnswer::Bad,
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            if !h.value.eq_ignore_ascii_case(b"chunked") {
                return ParsedAnswer::Bad;
            }
            chunked = true;
        } else if name.eq_ignore_ascii_case("connection") {
            if h.value.eq_ignore_ascii_case(b"close") {
                close = true;
                said_close = true;
            } else if !h.value.eq_ignore_ascii_case(b"keep-alive") {
                return ParsedAnswer::Bad;
            }
        } else if name.eq_ignore_ascii_case("x-request-id") {
            has_id = true;
        } else if name.eq_ignore_ascii_case("x-kubeserve-unserved") {
            unserved = true;
        } else if name.eq_ignore_ascii_case("upgrade") || name.eq_ignore_ascii_case("keep-alive") {
            return ParsedAnswer::Bad;
        }
    }
    let framing = if request_is_head || status == 204 || status == 304 {
        Framing::Empty
    } else if chunked {
        if length.is_some() {
            return ParsedAnswer::Bad;
        }
        Framing::Chunked
    } else if let Some(n) = length {
        Framing::Length(n)
    } else {
        close = true;
        Framing::UntilClose
    };
    let line_end = buf.iter().position(|&c| c == b'\n').unwrap() + 1;
    ParsedAnswer::Head(Answer {
        head_len,
        status,
        framing,
        close,
        said_close,
        has_id,
        unserved,
        line_end,
    })
}

/// Finds where a chunked body ends, fed the bytes as they pass (they are relayed verbatim).
pub struct ChunkScanner {
    state: St,
    size: u64,
    digits: u32,
}

#[derive(Clone, Copy, PartialEq)]
enum St {
    Size,
    Ext,
    SizeLf,
    Data(u64),
    DataCr,
    DataLf,
    TrailerStart,
    Trailer,
    FinalLf,
}

impl Default for ChunkScanner {
    fn default() -> Self {
        ChunkScanner {
            state: St::Size,
            size: 0,
            digits: 0,
        }
    }
}

impl ChunkScanner {
    /// `Ok(Some(n))`: the body ends after `n` bytes of `data`; `Ok(None)`: it goes on;
    /// `Err`: not valid chunked framing.
    pub fn feed(&mut self, data: &[u8]) -> Result<Option<usize>, ()> {
        let mut i = 0;
        while i < data.len() {
            let c = data[i];
            match self.state {
                St::Data(left) => {
                    let take = (data.len() - i).min(left as usize);
                    i += take;
                    let left = left - take as u64;
                    self.state = if left == 0 {
                        St::DataCr
                    } else {
                        St::Data(left)
                    };
                    continue;
                }
                St::Size => match c {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        self.digits += 1;
                        if self.digits > 15 {
                            return Err(());
                        }
                        self.size = self.size * 16 + (c as char).to_digit(16).unwrap() as u64;
                    }
                    b';' | b' ' | b'\t' if self.digits > 0 => self.state = St::Ext,
                    b'\r' if self.digits > 0 => self.state = St::SizeLf,
                    _ => return Err(()),
                },
                St::Ext => match c {
                    b'\r' => self.state = St::SizeLf,
                    b'\n' => return Err(()),
                    _ => {}
                },
                St::SizeLf => {
                    if c != b'\n' {
                        return Err(());
                    }
                    self.state = if self.size == 0 {
                        St::TrailerStart
                    } else {
                        St::Data(self.size)
                    };
                    self.size = 0;
                    self.digits = 0;
                }
                St::DataCr => {
                    if c != b'\r' {
                        return Err(());
                    }
                    self.state = St::DataLf;
                }
                St::DataLf => {
                    if c != b'\n' {
                        return Err(());
                    }
                    self.state = St::Size;
                }
                St::TrailerStart => match c {
                    b'\r' => self.state = St::FinalLf,
                    _ => self.state = St::Trailer,
                },
                St::Trailer => {
                    if c == b'\n' {
                        self.state = St::TrailerStart;
                    }
                }
                St::FinalLf => {
                    if c != b'\n' {
                        return Err(());
                    }
                    return Ok(Some(i + 1));
                }
            }
            i += 1;
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_end_is_found_across_splits() {
        let body = b"5\r\nhello\r\n3;x=y\r\nabc\r\n0\r\nX-T: 1\r\n\r\nNEXT";
        for split in 0..body.len() {
            let mut s = ChunkScanner::default();
            let first = s.feed(&body[..split]).unwrap();
            let end = match first {
                Some(n) => n,
                None => split + s.feed(&body[split..]).unwrap().unwrap(),
            };
            assert_eq!(end, body.len() - 4);
        }
    }

    #[test]
    fn requests_outside_the_fast_path_are_not_covered() {
        let cases: [&[u8]; 8] = [
            b"GET /a HTTP/1.0\r\n\r\n",
            b"GET /a HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
            b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET /a/../b HTTP/1.1\r\n\r\n",
            b"GET /%61 HTTP/1.1\r\n\r\n",
            b"GET /-/routes HTTP/1.1\r\n\r\n",
            b"GET /a HTTP/1.1\r\nx-request-id: a b\r\n\r\n",
            b"POST /a HTTP/1.1\r\nContent-Length: 999999\r\n\r\n",
        ];
        for case in cases {
            assert!(
                matches!(parse_request(case, 65536, 8192), Parsed::NotCovered),
                "{:?}",
                case
            );
        }
        match parse_request(
            b"POST /a/b?q=1 HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
            65536,
            8192,
        ) {
            Parsed::Covered(p) => {
                assert_eq!(p.content_length, 3);
                assert_eq!(&b"POST /a/b?q=1"[p.path_start..p.path_end], b"/a/b");
            }
            _ => panic!("a plain request is covered"),
        }
    }

    #[test]
    fn connection_close_is_covered_dropped_and_remembered() {
        let req = b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: Close\r\n\r\n";
        match parse_request(req, 65536, 8192) {
            Parsed::Covered(p) => {
                assert!(p.close);
                assert_eq!(&req[p.drop_start..p.drop_end], b"Connection: Close\r\n");
            }
            _ => panic!("Connection: close is covered"),
        }
        let other = b"GET /a HTTP/1.1\r\nConnection: close, te\r\n\r\n";
        assert!(matches!(
            parse_request(other, 65536, 8192),
            Parsed::NotCovered
        ));
    }
}
