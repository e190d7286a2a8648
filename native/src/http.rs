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

/// HTTP/1.1 chunked transfer coding (RFC 9112, section 7.1), scanned as the bytes arrive: where
/// the body ends, and (`feed_with`) which bytes of it are chunk data. The one state machine of the
/// native front for it: `serve.rs` relays an answer's bytes verbatim and asks only where it ends;
/// `frames::Dechunker` takes the data out of a streamed handle call's answer.
///
/// Refused (`Err`): a size line without hex digits, or with more than 15 of them, or larger than
/// the scanner's limit; anything but `;`, space or tab between the size and the line's end, a bare
/// LF in a chunk extension; chunk data not followed by CRLF; a trailer line with a CR or LF
/// other than its ending CRLF; a last line that is not CRLF. Nothing is held: the state is a few
/// words, whatever the body's size.
pub struct ChunkScanner {
    state: St,
    size: u64,
    digits: u32,
    max_chunk: u64,
}

#[derive(Clone, Copy, PartialEq)]
enum St {
    Size,
    Ext,
    SizeLf,
    Data(u64),
    DataCr,
    DataLf,
    /// at the start of a trailer line, or of the empty line that ends the body
    TrailerStart,
    Trailer,
    TrailerLf,
    FinalLf,
    Done,
}

/// At most 15 hex digits in a chunk size line (leading zeros included): a size below 2^60.
const MAX_SIZE_DIGITS: u32 = 15;

impl Default for ChunkScanner {
    fn default() -> Self {
        ChunkScanner::with_max_chunk(u64::MAX)
    }
}

impl ChunkScanner {
    /// A scanner that also refuses a chunk larger than `max_chunk` bytes.
    pub fn with_max_chunk(max_chunk: u64) -> Self {
        ChunkScanner {
            state: St::Size,
            size: 0,
            digits: 0,
            max_chunk,
        }
    }

    /// `Ok(Some(n))`: the body ends after `n` bytes of `data` (0 once it has ended);
    /// `Ok(None)`: it goes on; `Err`: not valid chunked framing.
    #[inline]
    pub fn feed(&mut self, data: &[u8]) -> Result<Option<usize>, ()> {
        self.feed_with(data, |_| {})
    }

    /// `feed`, handing `on_data` each run of chunk data it crosses, in order (a chunk split
    /// across feeds comes in as many runs).
    pub fn feed_with(
        &mut self,
        data: &[u8],
        mut on_data: impl FnMut(&[u8]),
    ) -> Result<Option<usize>, ()> {
        let mut i = 0;
        while i < data.len() {
            let c = data[i];
            match self.state {
                St::Data(left) => {
                    let take = (data.len() - i).min(left as usize);
                    on_data(&data[i..i + take]);
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
                        if self.digits > MAX_SIZE_DIGITS {
                            return Err(());
                        }
                        self.size = self.size * 16 + (c as char).to_digit(16).unwrap() as u64;
                        if self.size > self.max_chunk {
                            return Err(());
                        }
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
                    b'\n' => return Err(()),
                    _ => self.state = St::Trailer,
                },
                St::Trailer => match c {
                    b'\r' => self.state = St::TrailerLf,
                    b'\n' => return Err(()),
                    _ => {}
                },
                St::TrailerLf => {
                    if c != b'\n' {
                        return Err(());
                    }
                    self.state = St::TrailerStart;
                }
                St::FinalLf => {
                    if c != b'\n' {
                        return Err(());
                    }
                    self.state = St::Done;
                    return Ok(Some(i + 1));
                }
                St::Done => return Ok(Some(0)),
            }
            i += 1;
        }
        Ok((self.state == St::Done).then_some(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feed `body` cut at `cuts` (ascending): the end found (offset in `body`) and the data.
    fn scan(scanner: &mut ChunkScanner, body: &[u8], cuts: &[usize]) -> (Option<usize>, Vec<u8>) {
        let mut data = Vec::new();
        let mut from = 0;
        for &to in cuts.iter().chain(std::iter::once(&body.len())) {
            let got = scanner
                .feed_with(&body[from..to], |run| {
                    assert!(!run.is_empty());
                    data.extend_from_slice(run)
                })
                .unwrap_or_else(|()| panic!("{:?} cut at {:?}", body, cuts));
            if let Some(n) = got {
                return (Some(from + n), data);
            }
            from = to;
        }
        (None, data)
    }

    const GOOD: &[u8] = b"5\r\nhello\r\n3;x=y\r\nabc\r\n1A \t;ext\r\nabcdefghijklmnopqrstuvwxyz\r\n0;z\r\nX-T: 1\r\nX-U:\r\n\r\n";
    const GOOD_DATA: &[u8] = b"helloabcabcdefghijklmnopqrstuvwxyz";

    #[test]
    fn chunked_end_is_found_across_splits() {
        let mut body = GOOD.to_vec();
        body.extend_from_slice(b"NEXT");
        for split in 0..=body.len() {
            let mut s = ChunkScanner::default();
            assert_eq!(
                scan(&mut s, &body, &[split]),
                (Some(GOOD.len()), GOOD_DATA.to_vec())
            );
            // once ended, the scanner says so for whatever follows
            assert_eq!(s.feed(b"more"), Ok(Some(0)));
            assert_eq!(s.feed(b""), Ok(Some(0)));
        }
    }

    #[test]
    fn chunked_data_at_every_pair_of_splits_and_byte_by_byte() {
        for a in 0..=GOOD.len() {
            for b in a..=GOOD.len() {
                let mut s = ChunkScanner::default();
                assert_eq!(
                    scan(&mut s, GOOD, &[a, b]),
                    (Some(GOOD.len()), GOOD_DATA.to_vec())
                );
            }
        }
        let mut s = ChunkScanner::default();
        let cuts: Vec<usize> = (1..GOOD.len()).collect();
        assert_eq!(
            scan(&mut s, GOOD, &cuts),
            (Some(GOOD.len()), GOOD_DATA.to_vec())
        );
        let mut s = ChunkScanner::default();
        assert_eq!(scan(&mut s, b"0\r\n\r\n", &[]), (Some(5), Vec::new()));
        let mut s = ChunkScanner::default();
        assert_eq!(scan(&mut s, b"4\r\nab", &[1, 4]), (None, b"ab".to_vec()));
    }

    #[test]
    fn bad_chunked_framing_is_refused_at_every_split() {
        let digits16 = b"0000000000000001\r\nx\r\n0\r\n\r\n";
        let cases: [&[u8]; 17] = [
            b"zz\r\n",
            b"\r\n\r\n",                   // a size line without digits
            b";x\r\n0\r\n\r\n",            // an extension without a size
            b"5\n",                        // a bare LF after the size
            b"5x\r\n",                     // no separator before an extension
            b"5\rX",                       // CR not followed by LF
            b"3;a\nb\r\nabc\r\n0\r\n\r\n", // a bare LF in an extension
            b"3\r\nabcX\r\n",              // chunk data longer than announced
            b"3\r\nabc\rX",                // data followed by CR and not LF
            b"3\r\nabc\n",                 // data followed by a bare LF
            b"0\r\n\n",                    // a bare LF as the last line
            b"0\r\n\rX",                   // CR then not LF at the end
            b"0\r\nX-T: 1\n\r\n",          // a trailer line ending in a bare LF
            b"0\r\nX-T:\r1\r\n\r\n",       // a bare CR in a trailer line
            b"0\r\nX-T: 1\r\n\n",          // a bare LF after a trailer
            b"1000000000000000\r\n",       // 16 digits: over 2^60
            digits16,                      // 16 digits, leading zeros
        ];
        for case in cases {
            for split in 0..=case.len() {
                let mut s = ChunkScanner::default();
                let first = s.feed(&case[..split]);
                let refused = first.is_err() || s.feed(&case[split..]).is_err();
                assert!(refused, "{:?} split at {}", case, split);
            }
        }
        // 15 digits: the largest size taken
        let mut s = ChunkScanner::default();
        assert_eq!(s.feed(b"fffffffffffffff\r\nab"), Ok(None));
        let mut s = ChunkScanner::default();
        assert_eq!(s.feed(b"000000000000001\r\nx\r\n0\r\n\r\n"), Ok(Some(25)));
        // the scanner's own limit, exact
        let mut s = ChunkScanner::with_max_chunk(16);
        assert_eq!(s.feed(b"10\r\n"), Ok(None));
        let mut s = ChunkScanner::with_max_chunk(16);
        assert_eq!(s.feed(b"11"), Err(()));
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
