//! The fast path's event loop: client connections, the replica pools, the control socket.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io;
use std::rc::Rc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::watch;

use crate::access::AccessLines;
use crate::channel::{self, Channel};
use crate::http::{self, ChunkScanner, Framing, Parsed, ParsedAnswer};
use crate::routing::{self, pick, records_answer, Deployment, Pending, Registry, Reply};
use crate::tls::{ClientStream, Tls};

#[derive(Default)]
struct Table {
    by_prefix: HashMap<String, usize>,
    deployments: Vec<Rc<Deployment>>,
}

impl Table {
    /// `RouteTable.match`: the longest route prefix at a segment boundary of `path`.
    fn route(&self, path: &str) -> Option<usize> {
        let mut end = path.len();
        if end > 1 && path.ends_with('/') {
            end -= 1;
        }
        while end > 0 {
            if let Some(&d) = self.by_prefix.get(&path[..end]) {
                return Some(d);
            }
            end = path[..end].rfind('/').unwrap_or(0);
        }
        self.by_prefix.get("/").copied()
    }
}

#[derive(Default)]
struct Counters {
    /// (method label, deployment key, status) -> requests since the last take
    records: HashMap<(&'static str, String, u16), Pending>,
    /// (deployment key, status) -> requests answered on the fast path
    answered: HashMap<(String, u16), u64>,
    /// deployment key -> sum of latencies (ms) on the fast path
    latency_ms: HashMap<String, f64>,
    handed_off: u64,
    upstream_connects: u64,
    /// connections refused over `max_connections` since the last take
    refused: u64,
}

struct Shared {
    secret: Vec<u8>,
    fallback: String,
    table: RefCell<Rc<Table>>,
    /// the replicas, shared with the gRPC front (`routing.rs`)
    registry: Rc<Registry>,
    keep_alive: Cell<Duration>,
    max_body: Cell<usize>,
    max_head: Cell<usize>,
    max_url: Cell<usize>,
    /// `RequestLimits.header_timeout_s` and `body_timeout_s`
    header_timeout: Cell<Duration>,
    body_timeout: Cell<Duration>,
    /// `http_options.request_timeout_s`
    request_timeout: Cell<Option<Duration>>,
    /// access lines for the Python proxy to write (`logging_config.enable_access_log`)
    access: RefCell<AccessLines>,
    /// the latency histogram's upper bounds (ms), `metrics.LATENCY_BUCKETS_MS`
    buckets: RefCell<Vec<f64>>,
    counters: RefCell<Counters>,
    /// `--max-connections` (as lowered by the Python proxy to fit the file descriptors)
    max_connections: Cell<usize>,
    /// client connections open (served, or spliced to the Python proxy)
    open: Cell<usize>,
    /// set once by the `drain` op: no more accepting, `Connection: close` on every answer,
    /// idle connections closed after `LEAVING_IDLE`, the others once their request is answered
    draining: watch::Sender<bool>,
    /// `draining`, read per answer
    leaving: Cell<bool>,
    /// the client port's TLS (`tls.rs`): off, or the newest certificate pair pushed
    tls: Tls,
    /// set by the first snapshot installed (`routed` wakes the accept loop)
    has_state: Cell<bool>,
    routed: tokio::sync::Notify,
}

pub async fn run(
    secret: Vec<u8>,
    listen: String,
    control: String,
    fallback: String,
    tls: bool,
    registry: Rc<Registry>,
) -> io::Result<()> {
    let listener = match listen.strip_prefix("fd:") {
        Some(fd) => {
            use std::os::fd::FromRawFd;
            let fd: i32 = fd
                .parse()
                .map_err(|_| io::Error::other("--listen fd:N takes a number"))?;
            // an inherited listening socket (`kubeserve start` keeps one across proxy restarts)
            let std_listener = unsafe { std::net::TcpListener::from_raw_fd(fd) };
            std_listener.set_nonblocking(true)?;
            TcpListener::from_std(std_listener)?
        }
        None => TcpListener::bind(&listen).await?,
    };
    let shared = Rc::new(Shared {
        secret,
        fallback,
        table: RefCell::new(Rc::new(Table::default())),
        registry,
        keep_alive: Cell::new(Duration::from_secs(90)),
        max_body: Cell::new(64 * 1024),
        max_head: Cell::new(16 * 1024),
        max_url: Cell::new(8 * 1024),
        header_timeout: Cell::new(Duration::from_secs(20)),
        body_timeout: Cell::new(Duration::from_secs(20)),
        request_timeout: Cell::new(None),
        access: RefCell::default(),
        buckets: RefCell::new(Vec::new()),
        counters: RefCell::new(Counters::default()),
        max_connections: Cell::new(usize::MAX),
        open: Cell::new(0),
        draining: watch::Sender::new(false),
        leaving: Cell::new(false),
        tls: Tls::new(tls),
        has_state: Cell::new(false),
        routed: tokio::sync::Notify::new(),
    });
    let control_listener = routing::bind_control(&control)?;
    eprintln!(
        "kubeserve-fastpath listening on {} (control {control})",
        listener.local_addr()?
    );
    routing::serve_control(control_listener, shared.clone(), handle_control);
    // serving HTTPS: not before the first certificate pair is in
    shared.tls.ready().await;
    // Nothing is accepted before the first snapshot, as the Python proxy does: a request for a
    // configured route is never handed off to a proxy still starting (on an inherited socket,
    // connections wait in its backlog meanwhile).
    while !shared.has_state.get() {
        shared.routed.notified().await;
    }
    accept_until_drained(&shared, listener).await?;
    // the open connections finish (`open_connections` in `stats` says when none is left), the
    // control socket still answers: the Python proxy takes the last records, then ends us
    std::future::pending::<()>().await;
    Ok(())
}

/// Accept client connections (each within `max_connections`, see `admit`) until the `drain`
/// op; then stop accepting.
async fn accept_until_drained(shared: &Rc<Shared>, listener: TcpListener) -> io::Result<()> {
    let mut drained = shared.draining.subscribe();
    loop {
        let client = tokio::select! {
            accepted = listener.accept() => accepted?.0,
            _ = drained.wait_for(|d| *d) => break,
        };
        if let Some(open) = admit(shared) {
            let _ = client.set_nodelay(true);
            tokio::task::spawn_local(client_connection(open, client));
        } else {
            tokio::task::spawn_local(refuse(client));
        }
    }
    drop(listener); // (an inherited socket stays open in the process that passed it)
    Ok(())
}

/// One open client connection, counted while it lives.
struct Open(Rc<Shared>);

impl Drop for Open {
    fn drop(&mut self) {
        crate::memory::note();
        self.0.open.set(self.0.open.get() - 1);
    }
}

/// The Python proxy's rule at accept (`ProxyServer._accept`): below `max_connections` open, the
/// connection is served; else it is refused (`refuse`) and counted.
fn admit(sh: &Rc<Shared>) -> Option<Open> {
    if sh.open.get() >= sh.max_connections.get() {
        sh.counters.borrow_mut().refused += 1;
        return None;
    }
    sh.open.set(sh.open.get() + 1);
    Some(Open(sh.clone()))
}

/// The Python proxy's answer to a connection over the limit (`server._REFUSAL`), byte for byte.
const REFUSAL: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\n\
Content-Type: text/plain; charset=utf-8\r\nContent-Length: 40\r\n\r\n\
too many open connections to this proxy\n";

async fn refuse(mut client: TcpStream) {
    let _ = tokio::time::timeout(Duration::from_secs(5), client.write_all(REFUSAL)).await;
    let _ = client.shutdown().await;
}

/// While draining, how long a connection may idle before it is closed (the Python proxy's
/// `server._LEAVING_IDLE_S`): a request sent within it is answered with `Connection: close`.
const LEAVING_IDLE: Duration = Duration::from_secs(1);

// -- control ----------------------------------------------------------------------------------

fn handle_control(sh: &Shared, msg: &Value) -> Reply {
    Reply::Json(match msg.get("op").and_then(Value::as_str) {
        Some("state") => match apply_state(sh, msg) {
            Ok(()) => {
                if !sh.has_state.replace(true) {
                    sh.routed.notify_one();
                }
                json!({"ok": true})
            }
            Err(e) => json!({"ok": false, "error": e}),
        },
        Some("tls") => {
            let field = |name: &str| msg.get(name).and_then(Value::as_str);
            let (Some(cert), Some(key)) = (field("cert_pem"), field("key_pem")) else {
                return Reply::Json(
                    json!({"ok": false, "error": "cert_pem, key_pem: strings required"}),
                );
            };
            match sh.tls.install(cert, key, field("ca_pem")) {
                Ok(()) => json!({"ok": true}),
                Err(e) => json!({"ok": false, "error": e}),
            }
        }
        Some("stats") => {
            let c = sh.counters.borrow();
            let mut answered = serde_json::Map::new();
            for ((key, status), n) in &c.answered {
                let entry = answered.entry(key.clone()).or_insert_with(|| json!({}));
                entry[status.to_string()] = json!(n);
            }
            json!({
                "ok": true,
                "answered": answered,
                "latency_ms_sum": c.latency_ms,
                "handed_off": c.handed_off,
                "upstream_connects": c.upstream_connects,
                "open_connections": sh.open.get(),
                "draining": *sh.draining.borrow(),
                "tls_installs": sh.tls.installs.get(),
            })
        }
        Some("take_records") => {
            let mut c = sh.counters.borrow_mut();
            let records: Vec<Value> = c
                .records
                .drain()
                .map(|((method, key, status), p)| {
                    json!({"method": method, "key": key, "status": status, "count": p.count,
                           "total_ms": p.total_ms, "buckets": p.buckets})
                })
                .collect();
            let refused = std::mem::take(&mut c.refused);
            drop(c);
            let rest = json!({"ok": true, "records": records, "refused": refused});
            return records_answer(rest, &sh.access);
        }
        Some("load") => match sh.registry.apply_load(msg) {
            Ok(ours) => json!({"ok": true, "in_flight": ours}),
            Err(e) => json!({"ok": false, "error": e}),
        },
        Some("drain") => {
            sh.leaving.set(true);
            sh.draining.send_replace(true);
            json!({"ok": true})
        }
        _ => json!({
            "ok": false,
            "error": "op: must be state, tls, stats, take_records, load or drain"
        }),
    })
}

/// Install a discovery snapshot (`kubeserve.runtime.wire.Snapshot`) and the settings with it.
fn apply_state(sh: &Shared, msg: &Value) -> Result<(), String> {
    let snap = msg.get("snapshot").ok_or("snapshot: missing")?;
    let routes = sh.registry.install(snap)?;
    let mut table = Table::default();
    for route in routes.routes {
        // a custom request router chooses in the Python proxy: its requests are handed off
        if !routes.deployments[route.deployment].custom_router {
            table.by_prefix.insert(route.prefix, route.deployment);
        }
    }
    table.deployments = routes.deployments;
    for (name, cell) in [
        ("header_timeout_s", &sh.header_timeout),
        ("body_timeout_s", &sh.body_timeout),
    ] {
        if let Some(s) = msg.get(name).and_then(Value::as_f64) {
            if s > 0.0 && s.is_finite() {
                cell.set(Duration::from_secs_f64(s));
            }
        }
    }
    if let Some(s) = msg.get("keep_alive_timeout_s").and_then(Value::as_f64) {
        if s > 0.0 && s.is_finite() {
            sh.keep_alive.set(Duration::from_secs_f64(s));
        }
    }
    if let Some(n) = msg.get("max_body_bytes").and_then(Value::as_u64) {
        sh.max_body.set(n as usize);
    }
    routing::Common {
        buckets: &sh.buckets,
        request_timeout: &sh.request_timeout,
        access: &sh.access,
    }
    .apply(msg)?;
    if let Some(n) = msg.get("max_url_bytes").and_then(Value::as_u64) {
        sh.max_url.set(n as usize);
    }
    if let Some(n) = msg.get("max_head_bytes").and_then(Value::as_u64) {
        sh.max_head.set(n as usize);
    }
    if let Some(n) = msg.get("max_connections").and_then(Value::as_u64) {
        sh.max_connections.set(n.max(1) as usize);
    }
    *sh.table.borrow_mut() = Rc::new(table);
    Ok(())
}

// -- client connections -----------------------------------------------------------------------

async fn read_more(client: &mut ClientStream, buf: &mut Vec<u8>) -> io::Result<usize> {
    if buf.capacity() - buf.len() < 4096 {
        buf.reserve(16 * 1024);
    }
    client.read_buf(buf).await
}

/// Buffers one client connection reuses for every request it forwards.
struct Scratch {
    /// what one read from the replica takes: `RAW_SMALL`, `RAW_LARGE` once a read filled it
    raw: Vec<u8>,
    plain: Vec<u8>,
    out: Vec<u8>,
    /// the request as sealed for the replica
    sealed: Vec<u8>,
    /// bytes of the client's next request, read while watching it during an answer (see
    /// `replica_or_client`), put behind the parsed ones once the answer is relayed
    early: Vec<u8>,
}

/// The replica read buffer of a connection, and what it grows to for large answers.
const RAW_SMALL: usize = 16 * 1024;
const RAW_LARGE: usize = 64 * 1024;
/// Most capacity a buffer of a connection keeps from one request to the next (more, and it is
/// cut back: memory of a past large request is not held by an idle keep-alive connection).
const KEPT: usize = 64 * 1024;

impl Scratch {
    /// Read from the replica into `raw`; a read that fills it grows it (up to `RAW_LARGE`).
    async fn read(raw: &mut Vec<u8>, ch: &mut Channel) -> io::Result<usize> {
        let n = ch.stream.read(raw).await?;
        if n == raw.len() && raw.len() < RAW_LARGE {
            raw.resize(RAW_LARGE, 0);
        }
        Ok(n)
    }

    /// After a request: cut back what a large one left (`KEPT`).
    fn trim(&mut self) {
        if self.raw.len() > RAW_SMALL {
            self.raw.truncate(RAW_SMALL);
            self.raw.shrink_to_fit();
        }
        for v in [
            &mut self.plain,
            &mut self.out,
            &mut self.sealed,
            &mut self.early,
        ] {
            if v.capacity() > KEPT {
                *v = Vec::new();
            }
        }
    }
}

/// What a generated request id's header line starts with.
const ID_LINE: &[u8] = b"x-request-id: ";

/// What waiting for more bytes from the client ended with.
enum Wait {
    Read(io::Result<usize>),
    TimedOut,
    /// the `drain` op came while the connection was idle
    Draining,
}

/// One timer for the life of a client connection, moved lazily: each wait sets the deadline it
/// wants; the timer is only reset when that deadline is sooner than the armed one, or when the
/// armed one passes before the wanted one (then it is re-armed). A new tokio timer per read
/// would cost a registration and a removal in the timer wheel per request.
struct IdleTimer {
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
    armed: tokio::time::Instant,
}

impl IdleTimer {
    fn new() -> IdleTimer {
        let far = tokio::time::Instant::now() + Duration::from_secs(86400 * 365);
        IdleTimer {
            sleep: Box::pin(tokio::time::sleep_until(far)),
            armed: far,
        }
    }

    /// Read more of the client's bytes into `buf`, for at most `limit`; with `drain`, a drain
    /// (its future completing) ends the wait too.
    async fn read(
        &mut self,
        client: &mut ClientStream,
        buf: &mut Vec<u8>,
        limit: Duration,
        mut drain: Option<std::pin::Pin<&mut dyn std::future::Future<Output = ()>>>,
    ) -> Wait {
        let deadline = tokio::time::Instant::now() + limit;
        if deadline < self.armed {
            self.sleep.as_mut().reset(deadline);
            self.armed = deadline;
        }
        loop {
            let draining = async {
                match drain.as_mut() {
                    Some(d) => d.as_mut().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                read = read_more(client, buf) => return Wait::Read(read),
                _ = self.sleep.as_mut() => {
                    if tokio::time::Instant::now() >= deadline {
                        return Wait::TimedOut;
                    }
                    self.sleep.as_mut().reset(deadline);
                    self.armed = deadline;
                }
                _ = draining => return Wait::Draining,
            }
        }
    }
}

async fn client_connection(open: Open, tcp: TcpStream) {
    let sh = open.0.clone();
    let Some(mut client) = ClientStream::accept(sh.tls.current(), tcp).await else {
        return; // a failed TLS handshake
    };
    // completes once, at the drain op (`sh.leaving` says so from then on)
    let mut drained = sh.draining.subscribe();
    let drain = async move {
        let _ = drained.wait_for(|d| *d).await;
    };
    let mut drain = std::pin::pin!(drain);
    let mut drain_seen = false;
    let mut timer = IdleTimer::new();
    // small to start with, grown on demand, cut back after a large request (`Scratch::trim`)
    let mut buf: Vec<u8> = Vec::with_capacity(4 * 1024);
    let mut first = true;
    let mut scratch = Scratch {
        raw: vec![0u8; RAW_SMALL],
        plain: Vec::new(),
        out: Vec::new(),
        sealed: Vec::new(),
        early: Vec::new(),
    };
    loop {
        // the head of the next request
        let plan = loop {
            if !buf.is_empty() {
                match http::parse_request(&buf, sh.max_body.get(), sh.max_url.get()) {
                    Parsed::Covered(plan) => break plan,
                    Parsed::NotCovered => return hand_off(&sh, open, client, buf).await,
                    Parsed::Partial if buf.len() > sh.max_head.get() => {
                        return hand_off(&sh, open, client, buf).await
                    }
                    Parsed::Partial => {}
                }
            }
            // as the Python proxy: idle between requests up to the keep-alive timeout (the header
            // timeout when shorter, before the first byte); a partial head, the header timeout
            let limit = if !buf.is_empty() {
                sh.header_timeout.get()
            } else if first {
                sh.keep_alive.get().min(sh.header_timeout.get())
            } else {
                sh.keep_alive.get()
            };
            let read = if !buf.is_empty() {
                timer.read(&mut client, &mut buf, limit, None).await
            } else if drain_seen || sh.leaving.get() {
                timer
                    .read(&mut client, &mut buf, limit.min(LEAVING_IDLE), None)
                    .await
            } else {
                // idle between requests: a drain shortens the wait (checked again above)
                let d: std::pin::Pin<&mut dyn std::future::Future<Output = ()>> = drain.as_mut();
                timer.read(&mut client, &mut buf, limit, Some(d)).await
            };
            match read {
                Wait::Read(Ok(0)) | Wait::Read(Err(_)) => return,
                Wait::Read(Ok(_)) => {}
                Wait::Draining => drain_seen = true,
                Wait::TimedOut if buf.is_empty() => return, // idle past the keep-alive timeout
                Wait::TimedOut => return hand_off(&sh, open, client, buf).await, // its 408
            }
        };
        let total = plan.head_len + plan.content_length;
        while buf.len() < total {
            // the body idle timeout: the Python proxy answers the late client (408)
            match timer
                .read(&mut client, &mut buf, sh.body_timeout.get(), None)
                .await
            {
                Wait::Read(Ok(0)) | Wait::Read(Err(_)) => return,
                Wait::Read(Ok(_)) | Wait::Draining => {}
                Wait::TimedOut => return hand_off(&sh, open, client, buf).await,
            }
        }
        let outcome = forward(&sh, &plan, &buf[..total], &mut client, &mut scratch).await;
        if !scratch.early.is_empty() {
            // the client's next request, read behind this one while its answer was awaited
            buf.extend_from_slice(&scratch.early);
            scratch.early.clear();
        }
        match outcome {
            Outcome::Done { keep_alive: true } => {
                first = false;
                buf.drain(..total);
                if buf.capacity() > KEPT && buf.len() <= KEPT / 2 {
                    buf.shrink_to(KEPT / 2);
                }
                scratch.trim();
            }
            Outcome::Done { keep_alive: false } => {
                let _ = client.shutdown().await; // over TLS, its close_notify first
                return;
            }
            Outcome::Failed => return,
            Outcome::HandOff => return hand_off(&sh, open, client, buf).await,
        }
    }
}

/// Splice the connection to the Python proxy, starting with the bytes already read; the
/// connection counts as open (`open`) until the splice ends. Over TLS the Python proxy gets the
/// decrypted bytes. Its private listener is a unix socket (`--fallback unix:PATH`, in a directory
/// only its user may enter: no other local process can reach it and skip what the client port
/// checks, a client certificate say), or `HOST:PORT`.
async fn hand_off(sh: &Shared, open: Open, mut client: ClientStream, buf: Vec<u8>) {
    sh.counters.borrow_mut().handed_off += 1;
    if let Some(path) = sh.fallback.strip_prefix("unix:") {
        let Ok(proxy) = UnixStream::connect(path).await else {
            return;
        };
        send_and_splice(&mut client, proxy, buf).await;
    } else {
        let Ok(proxy) = TcpStream::connect(&sh.fallback).await else {
            return;
        };
        let _ = proxy.set_nodelay(true);
        send_and_splice(&mut client, proxy, buf).await;
    }
    drop(open);
}

async fn send_and_splice<P: AsyncRead + AsyncWrite + Unpin>(
    client: &mut ClientStream,
    mut proxy: P,
    buf: Vec<u8>,
) {
    if proxy.write_all(&buf).await.is_err() {
        return;
    }
    drop(buf);
    splice(client, &mut proxy).await;
}

/// Copy both ways until the Python proxy closes its end (then the client's connection closes
/// too, as when the client talks to it directly); a client that stops sending (half-close) has
/// that passed on, and its answers still flow.
async fn splice<P: AsyncRead + AsyncWrite + Unpin>(client: &mut ClientStream, proxy: &mut P) {
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut proxy_read, mut proxy_write) = tokio::io::split(proxy);
    let up = async {
        let _ = tokio::io::copy(&mut client_read, &mut proxy_write).await;
        let _ = proxy_write.shutdown().await;
        std::future::pending::<()>().await
    };
    let down = tokio::io::copy(&mut proxy_read, &mut client_write);
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

enum Outcome {
    Done {
        keep_alive: bool,
    },
    /// nothing reached a replica's user code: the Python proxy takes the request over
    HandOff,
    /// the answer had started: the connection is closed
    Failed,
}

async fn forward(
    sh: &Shared,
    plan: &http::Plan,
    request: &[u8],
    client: &mut ClientStream,
    scratch: &mut Scratch,
) -> Outcome {
    let started = Instant::now();
    let table = sh.table.borrow().clone();
    let Ok(path) = std::str::from_utf8(&request[plan.path_start..plan.path_end]) else {
        return Outcome::HandOff;
    };
    let Some(d) = table.route(path) else {
        return Outcome::HandOff;
    };
    let dep = &table.deployments[d];
    let Some(slot) = pick(dep) else {
        return Outcome::HandOff;
    };
    let replica = slot.0.clone();
    // the request as forwarded: a generated request id after the request line
    let mut id_buf = [0u8; ID_LINE.len() + 34];
    let id_line: &[u8] = if plan.has_id {
        &[]
    } else {
        id_buf[..ID_LINE.len()].copy_from_slice(ID_LINE);
        id_buf[ID_LINE.len()..ID_LINE.len() + 32].copy_from_slice(&routing::request_id());
        id_buf[ID_LINE.len() + 32..].copy_from_slice(b"\r\n");
        &id_buf
    };
    let (kept, rest): (&[u8], &[u8]) = if plan.drop_end == 0 {
        (&request[plan.line_end..], &[])
    } else {
        (
            &request[plan.line_end..plan.drop_start],
            &request[plan.drop_end..],
        )
    };
    let forwarded: [&[u8]; 4] = [&request[..plan.line_end], id_line, kept, rest];
    let mut ch = match routing::take_idle(&replica.idle) {
        Some(ch) => ch,
        None => {
            sh.counters.borrow_mut().upstream_connects += 1;
            match channel::connect(&sh.secret, &replica.host, replica.port, &replica.id).await {
                Ok(ch) => ch,
                // nothing was written: the Python proxy tries another replica, or answers
                Err(_) => return Outcome::HandOff,
            }
        }
    };
    let sealed = &mut scratch.sealed;
    sealed.clear();
    ch.sealer.seal_parts_into(&forwarded, sealed);
    if ch.stream.write_all(sealed).await.is_err() {
        let message: &[u8] = b"the replica closed the connection before answering";
        return local_answer(
            sh, plan, request, client, id_line, dep, started, 502, message,
        )
        .await;
    }
    let mut responded = false;
    let relayed = relay(
        sh,
        plan,
        request,
        &mut ch,
        client,
        id_line,
        dep,
        started,
        scratch,
        &mut responded,
    );
    let outcome = match sh.request_timeout.get() {
        None => relayed.await,
        Some(limit) => {
            match tokio::time::timeout(limit.saturating_sub(started.elapsed()), relayed).await {
                Ok(outcome) => outcome,
                // as the Python proxy (exchange._timed_out): 504 unless the answer had begun
                Err(_) if !responded => {
                    let message: &[u8] = b"request timed out";
                    return local_answer(
                        sh, plan, request, client, id_line, dep, started, 504, message,
                    )
                    .await;
                }
                Err(_) => Relay::Failed,
            }
        }
    };
    match outcome {
        Relay::Done {
            reusable,
            keep_alive,
        } => {
            if reusable {
                ch.opener.trim();
                replica.idle.borrow_mut().push(ch);
            }
            Outcome::Done { keep_alive }
        }
        // as the Python proxy (exchange.upstream_failed): once a request was written it is
        // never sent again (the replica may have run it), the client gets a 502
        Relay::NothingBack => {
            let message: &[u8] = b"the replica closed the connection before answering";
            local_answer(
                sh, plan, request, client, id_line, dep, started, 502, message,
            )
            .await
        }
        Relay::Unserved => Outcome::HandOff,
        Relay::Failed => Outcome::Failed,
        // as the Python proxy (exchange.abort): dropping `ch` closes the replica connection,
        // which cancels the request's task there; counted 499, as Ray counts it
        Relay::ClientLeft => {
            record(sh, plan, request, id_line, dep, CLIENT_LEFT, started);
            Outcome::Failed
        }
    }
}

/// The status recorded for a request whose client left before its answer's end (Ray's).
const CLIENT_LEFT: u16 = 499;

/// The replica's next bytes (`Some`), or `None` once the client left: while a request waits
/// for (more of) its answer, the client's connection is watched, and its end (or an error)
/// means nobody reads the answer, so the request is cancelled, as Ray's proxy cancels it. A
/// client that sends its next request meanwhile (pipelining) is not watched any further: those
/// bytes are kept in `early` (at most `EARLY_MAX` of them). Costs no system call while the
/// client is quiet: tokio knows its socket has nothing to read since the request's short read.
async fn replica_or_client(
    raw: &mut Vec<u8>,
    ch: &mut Channel,
    client: &mut ClientStream,
    early: &mut Vec<u8>,
) -> Option<io::Result<usize>> {
    if !early.is_empty() {
        return Some(Scratch::read(raw, ch).await);
    }
    let left = async {
        early.reserve(EARLY_MAX);
        match client.read_buf(early).await {
            Ok(0) | Err(_) => {}
            Ok(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        biased;
        read = Scratch::read(raw, ch) => Some(read),
        _ = left => None,
    }
}

/// The most bytes of a pipelined request read while watching the client (see
/// `replica_or_client`).
const EARLY_MAX: usize = 1024;

fn record(
    sh: &Shared,
    plan: &http::Plan,
    request: &[u8],
    id_line: &[u8],
    dep: &Rc<Deployment>,
    status: u16,
    started: Instant,
) {
    crate::memory::note();
    let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
    let bounds = sh.buckets.borrow();
    let mut c = sh.counters.borrow_mut();
    *c.answered.entry((dep.key.clone(), status)).or_insert(0) += 1;
    match c.latency_ms.get_mut(dep.key.as_str()) {
        Some(sum) => *sum += latency_ms,
        None => {
            c.latency_ms.insert(dep.key.clone(), latency_ms);
        }
    }
    c.records
        .entry((plan.method, dep.key.clone(), status))
        .or_insert_with(|| Pending::new(&bounds))
        .add(&bounds, latency_ms);
    drop(c);
    let mut access = sh.access.borrow_mut();
    if access.on() {
        let sent = &request[..plan.path_start - 1];
        let method = if sent == plan.method.as_bytes() {
            std::borrow::Cow::Borrowed(plan.method)
        } else {
            String::from_utf8_lossy(sent)
        };
        let rid = if plan.has_id {
            String::from_utf8_lossy(&request[plan.id_start..plan.id_end])
        } else {
            String::from_utf8_lossy(&id_line[ID_LINE.len()..id_line.len() - 2])
        };
        let at = routing::unix_time();
        access.add(at, &method, &dep.route, status, latency_ms, &rid);
    }
}

/// An answer of our own (502: the replica closed the connection before answering a request
/// written to it; 504: `request_timeout_s`), then the connection closes.
#[allow(clippy::too_many_arguments)]
async fn local_answer(
    sh: &Shared,
    plan: &http::Plan,
    request: &[u8],
    client: &mut ClientStream,
    id_line: &[u8],
    dep: &Rc<Deployment>,
    started: Instant,
    status: u16,
    message: &[u8],
) -> Outcome {
    let reason = if status == 504 {
        "Gateway Timeout"
    } else {
        "Bad Gateway"
    };
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(format!("HTTP/1.1 {status} {reason}\r\n").as_bytes());
    // the bytes of the Python proxy's `http1.local_response`
    out.extend_from_slice(b"Content-Type: text/plain; charset=utf-8\r\n");
    out.extend_from_slice(format!("Content-Length: {}\r\n", message.len()).as_bytes());
    if plan.has_id {
        out.extend_from_slice(b"x-request-id: ");
        out.extend_from_slice(&request[plan.id_start..plan.id_end]);
        out.extend_from_slice(b"\r\n");
    } else {
        out.extend_from_slice(id_line);
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    if !plan.is_head {
        out.extend_from_slice(message);
    }
    let _ = client.write_all(&out).await;
    record(sh, plan, request, id_line, dep, status, started);
    Outcome::Failed
}

enum Relay {
    Done {
        reusable: bool,
        keep_alive: bool,
    },
    NothingBack,
    Unserved,
    Failed,
    /// the client closed its connection (or it failed) before the answer's end
    ClientLeft,
}

#[allow(clippy::too_many_arguments)]
async fn relay(
    sh: &Shared,
    plan: &http::Plan,
    request: &[u8],
    ch: &mut Channel,
    client: &mut ClientStream,
    id_line: &[u8],
    dep: &Rc<Deployment>,
    started: Instant,
    scratch: &mut Scratch,
    responded: &mut bool,
) -> Relay {
    let Scratch {
        raw,
        plain,
        out,
        early,
        ..
    } = scratch;
    plain.clear();
    out.clear();
    let answer = loop {
        let Some(read) = replica_or_client(raw, ch, client, early).await else {
            return Relay::ClientLeft;
        };
        let n = match read {
            Ok(0) | Err(_) if plain.is_empty() => return Relay::NothingBack,
            Ok(0) | Err(_) => return Relay::Failed,
            Ok(n) => n,
        };
        if ch.opener.feed(&raw[..n], plain).is_err() {
            return Relay::Failed;
        }
        match http::parse_answer(plain, plan.is_head) {
            ParsedAnswer::Partial => {}
            ParsedAnswer::Bad => return Relay::Failed,
            ParsedAnswer::Head(a) => break a,
        }
    };
    if answer.unserved {
        return Relay::Unserved;
    }
    out.extend_from_slice(&plain[..answer.line_end]);
    if !answer.has_id {
        out.extend_from_slice(id_line);
    }
    // as the Python proxy (`upstream`): a client that asked for it, a body that ends with the
    // connection, or a proxy that drains, ends the client's connection, and the answer says so
    let closing = !answer.said_close && (answer.close || plan.close || sh.leaving.get());
    if closing {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(&plain[answer.line_end..answer.head_len]);
    let body = &plain[answer.head_len..];
    let mut scanner = ChunkScanner::default();
    // how many body bytes are still to come (None: until the chunked end / close)
    let (mut done, extra) = match answer.framing {
        Framing::Empty => (true, !body.is_empty()),
        Framing::Length(n) => {
            if body.len() > n {
                return Relay::Failed;
            }
            (body.len() == n, false)
        }
        Framing::Chunked => match scanner.feed(body) {
            Ok(Some(end)) => (true, end != body.len()),
            Ok(None) => (false, false),
            Err(()) => return Relay::Failed,
        },
        Framing::UntilClose => (false, false),
    };
    if extra {
        return Relay::Failed; // bytes after the answer: the replica is out of step
    }
    out.extend_from_slice(body);
    let mut left = match answer.framing {
        Framing::Length(n) => n - body.len(),
        _ => 0,
    };
    *responded = true;
    if client.write_all(out).await.is_err() {
        return Relay::ClientLeft;
    }
    while !done {
        plain.clear();
        let Some(read) = replica_or_client(raw, ch, client, early).await else {
            return Relay::ClientLeft;
        };
        let n = match read {
            Ok(0) | Err(_) => {
                if matches!(answer.framing, Framing::UntilClose) {
                    break;
                }
                return Relay::Failed;
            }
            Ok(n) => n,
        };
        if ch.opener.feed(&raw[..n], plain).is_err() {
            return Relay::Failed;
        }
        match answer.framing {
            Framing::Length(_) => {
                if plain.len() > left {
                    return Relay::Failed;
                }
                left -= plain.len();
                done = left == 0;
            }
            Framing::Chunked => match scanner.feed(plain) {
                Ok(Some(end)) if end == plain.len() => done = true,
                Ok(Some(_)) | Err(()) => return Relay::Failed,
                Ok(None) => {}
            },
            _ => {}
        }
        if !plain.is_empty() && client.write_all(plain).await.is_err() {
            return Relay::ClientLeft;
        }
    }
    record(sh, plan, request, id_line, dep, answer.status, started);
    let reusable = !answer.close && !matches!(answer.framing, Framing::UntilClose);
    Relay::Done {
        reusable,
        keep_alive: !(answer.close || closing),
    }
}
