//! The native gRPC front (`--grpc-listen`): Ray Serve's gRPC ingress for the common call, HTTP/2
//! by the `h2` crate, with the Python grpc.aio server behind it for everything else.
//!
//! HTTP/2 multiplexes calls on one connection, so a connection cannot be spliced to Python as the
//! HTTP/1.1 path does: the hand-off is per call (per HTTP/2 stream). The native process is an
//! HTTP/2 client of the proxy's private gRPC listener (`--grpc-fallback unix:PATH`, a socket in a
//! directory only the proxy's user may enter; or `HOST:PORT`) and proxies the whole stream of
//! each call it does not serve (headers, messages, trailers, both ways), so reflection,
//! `RayServeAPIService`, client-streaming and bidirectional methods, unknown applications,
//! multiplexed models, binary metadata, compressed messages and calls no replica below its cap
//! can take are the Python server's, unchanged.
//!
//! What it serves: a unary or server-streaming method the Python proxy listed (op `state`, with
//! each method's call template), one uncompressed message, no `-bin` metadata, no
//! `multiplexed_model_id`, the application the `application` metadata names (any when only one
//! has a route). The call goes to a replica of the ingress deployment below its
//! `max_ongoing_requests` (`routing::pick`, shared with the HTTP front) as `POST
//! /-/call/<Method>` (a stream: `/-/stream/<Method>`) over a CONTROL connection of the sealed
//! channel, its body the pickle the Python ingress sends (`grpc_ingress.native_template`: the
//! template's holes filled with the message, the invocation metadata, the peer and the request
//! id), so replicas are unchanged. An answer (a stream's item) that is only the message (`M`) is
//! relayed as is, with `grpc-status: 0` and the `request_id` trailer at the end; a stream's
//! messages pass through in pieces as the replica yields them (`frames.rs`), under HTTP/2 flow
//! control. Any other answer (the method changed its context: `C`; an error) is a pickle only
//! Python reads: it goes to the private listener as a call of `kubeserve.internal.NativeRelay`,
//! signed with the data-plane secret (HMAC-SHA256, checked before anything is unpickled), whose
//! handler answers exactly what the Python ingress answers, and that answer is relayed (a
//! stream's item: its message, its context kept for the stream's status). A replica that did not
//! start the call (unserved) leaves it to the Python server whole. `grpc_options.request_timeout_s`
//! and the client's `grpc-timeout` (the sooner) end a call served here DEADLINE_EXCEEDED. A
//! client's reset (RST_STREAM) while the replica runs the call drops it, and with it the
//! replica's connection, whose loss cancels the method there: counted CANCELLED.
//!
//! Calls answered here are counted per (method, application, code) and taken by the Python
//! proxy with op `take_records` on this module's own control socket (`--grpc-control`), their
//! access lines formatted as the Python proxy writes them (`access.rs`) and handed over after
//! that answer.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use h2::{server::SendResponse, RecvStream, SendStream};
use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderValue, Request, Response};
use serde_json::{json, Value};
use sha2::Sha256;
use tokio::net::{TcpListener, TcpStream, UnixStream};

use crate::access::AccessLines;
use crate::channel::{self, Channel, ROLE_CONTROL};
use crate::frames::{self, Dechunker, FrameCutter, Piece};
use crate::http::{parse_answer, Answer as Parsed, Framing, ParsedAnswer};
use crate::routing::{
    self, pick, records_answer, Deployment, Pending, Registry, Replica, Reply, Rid, Slot,
};

/// The private service of the Python listener that answers a replica's pickled answer.
pub const RELAY_PATH: &str = "/kubeserve.internal.NativeRelay/Answer";
/// Largest request message served natively (larger ones: the Python server).
const MAX_NATIVE_MESSAGE: usize = 4 * 1024 * 1024;

/// One hole of a call template, filled per call.
#[derive(Clone, Copy)]
enum Hole {
    Data,
    Metadata,
    Peer,
    RequestId,
}

enum Part {
    Bytes(Vec<u8>),
    Hole(Hole),
}

struct Method {
    /// `/pkg.Service/Method`
    full: String,
    /// the deployment method called (`Method` of `/pkg.Service/Method`)
    name: String,
    template: Vec<Part>,
    /// a server-streaming method (`/-/stream/<name>`), else unary (`/-/call/<name>`)
    streaming: bool,
}

/// An application with a route, and its ingress deployment.
struct App {
    name: String,
    dep: Rc<Deployment>,
}

#[derive(Default)]
struct State {
    /// application -> its ingress deployment
    apps: HashMap<String, Rc<App>>,
    /// `/pkg.Service/Method` -> how to call it
    methods: HashMap<String, Rc<Method>>,
}

/// The calls of one (method, application, code) since the last take.
struct Record {
    method: Rc<Method>,
    app: Rc<App>,
    pending: Pending,
}

#[derive(Default)]
struct Counters {
    /// (method, application: their `Rc`s' addresses, held in the value; code name) -> calls
    /// since the last take (no key allocated per call)
    records: HashMap<(usize, usize, &'static str), Record>,
    served: u64,
    relayed: u64,
    handed_off: u64,
}

struct Front {
    secret: Vec<u8>,
    fallback: String,
    state: RefCell<Rc<State>>,
    /// the replicas, shared with the HTTP front (`routing.rs`)
    registry: Rc<Registry>,
    request_timeout: Cell<Option<Duration>>,
    access: RefCell<AccessLines>,
    buckets: RefCell<Vec<f64>>,
    counters: RefCell<Counters>,
    /// the HTTP/2 client connection to the Python listener (made on first need, remade when lost)
    python: RefCell<Option<h2::client::SendRequest<Bytes>>>,
}

pub async fn run(
    secret: Vec<u8>,
    listen: String,
    control: String,
    fallback: String,
    registry: Rc<Registry>,
) -> io::Result<()> {
    let listener = TcpListener::bind(&listen).await?;
    let front = Rc::new(Front {
        secret,
        fallback,
        state: RefCell::new(Rc::new(State::default())),
        registry,
        request_timeout: Cell::new(None),
        access: RefCell::default(),
        buckets: RefCell::new(Vec::new()),
        counters: RefCell::new(Counters::default()),
        python: RefCell::new(None),
    });
    let control_listener = routing::bind_control(&control)?;
    eprintln!(
        "kubeserve-fastpath grpc listening on {} (control {control})",
        listener.local_addr()?
    );
    routing::serve_control(control_listener, front.clone(), handle_control);
    loop {
        let (client, peer) = listener.accept().await?;
        let _ = client.set_nodelay(true);
        tokio::task::spawn_local(connection(front.clone(), client, peer));
    }
}

// -- control ----------------------------------------------------------------------------------

fn handle_control(front: &Front, msg: &Value) -> Reply {
    Reply::Json(match msg.get("op").and_then(Value::as_str) {
        Some("state") => match apply_state(front, msg) {
            Ok(()) => json!({"ok": true}),
            Err(e) => json!({"ok": false, "error": e}),
        },
        Some("take_records") => {
            let mut c = front.counters.borrow_mut();
            let records: Vec<Value> = c
                .records
                .drain()
                .map(|((_, _, code), r)| {
                    let p = r.pending;
                    json!({"method": r.method.full, "app": r.app.name, "key": r.app.dep.key,
                           "code": code, "count": p.count, "total_ms": p.total_ms,
                           "buckets": p.buckets})
                })
                .collect();
            let rest = json!({"ok": true, "records": records, "served": c.served, "relayed": c.relayed,
                              "handed_off": c.handed_off});
            drop(c);
            return records_answer(rest, &front.access);
        }
        _ => json!({"ok": false, "error": "op: must be state or take_records"}),
    })
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Install a discovery snapshot and the method templates: `{"op": "state", "snapshot": ...,
/// "methods": {"/pkg.S/M": {"name": "M", "template": [hex | "data" | "metadata" | "peer" |
/// "request_id", ...], "stream": bool}}, "request_timeout_s": ..., "latency_buckets_ms": [...], "access_log": ...}`.
fn apply_state(front: &Front, msg: &Value) -> Result<(), String> {
    let snap = msg.get("snapshot").ok_or("snapshot: missing")?;
    let mut state = State::default();
    if let Some(methods) = msg.get("methods") {
        let methods = methods.as_object().ok_or("methods: not an object")?;
        for (path, m) in methods {
            let name = m
                .get("name")
                .and_then(Value::as_str)
                .ok_or(format!("methods.{path}.name: not a string"))?;
            let parts = m
                .get("template")
                .and_then(Value::as_array)
                .ok_or(format!("methods.{path}.template: not a list"))?;
            let mut template = Vec::new();
            for p in parts {
                let p = p
                    .as_str()
                    .ok_or(format!("methods.{path}.template: not strings"))?;
                template.push(match p {
                    "data" => Part::Hole(Hole::Data),
                    "metadata" => Part::Hole(Hole::Metadata),
                    "peer" => Part::Hole(Hole::Peer),
                    "request_id" => Part::Hole(Hole::RequestId),
                    hex => {
                        Part::Bytes(unhex(hex).ok_or(format!("methods.{path}.template: bad hex"))?)
                    }
                });
            }
            state.methods.insert(
                path.clone(),
                Rc::new(Method {
                    full: path.clone(),
                    name: name.to_owned(),
                    template,
                    streaming: m.get("stream").and_then(Value::as_bool).unwrap_or(false),
                }),
            );
        }
    }
    let routes = front.registry.install(snap)?;
    for route in routes.routes {
        let dep = &routes.deployments[route.deployment];
        // a custom request router chooses in the Python proxy: its calls are handed off
        if !dep.custom_router {
            let app = Rc::new(App {
                name: route.app.clone(),
                dep: dep.clone(),
            });
            state.apps.insert(route.app, app);
        }
    }
    routing::Common {
        buckets: &front.buckets,
        request_timeout: &front.request_timeout,
        access: &front.access,
    }
    .apply(msg)?;
    *front.state.borrow_mut() = Rc::new(state);
    Ok(())
}

// -- client connections -----------------------------------------------------------------------

async fn connection(front: Rc<Front>, tcp: TcpStream, peer: SocketAddr) {
    let Ok(mut conn) = h2::server::Builder::new()
        .max_concurrent_streams(1000)
        .initial_window_size(1 << 20)
        .initial_connection_window_size(1 << 22)
        .handshake::<_, Bytes>(tcp)
        .await
    else {
        return;
    };
    // grpc core's spelling of the peer (`context.peer()`)
    let peer = Rc::new(match peer {
        SocketAddr::V4(a) => format!("ipv4:{a}"),
        SocketAddr::V6(a) => format!("ipv6:{a}"),
    });
    while let Some(Ok((request, respond))) = conn.accept().await {
        tokio::task::spawn_local(call(front.clone(), request, respond, peer.clone()));
    }
}

/// What a covered call needs from its head.
struct Head {
    method: Rc<Method>,
    app: Rc<App>,
    metadata: Vec<(String, String)>,
    request_id: Rid,
    /// the client's `grpc-timeout`
    client_timeout: Option<Duration>,
}

/// The call's head when it is one this module serves.
fn covered(front: &Front, request: &Request<RecvStream>) -> Option<Head> {
    if request.method() != http::Method::POST {
        return None;
    }
    let full = request.uri().path();
    let state = front.state.borrow().clone();
    let method = state.methods.get(full)?.clone();
    let headers = request.headers();
    if !headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
    {
        return None;
    }
    let mut metadata = Vec::new();
    let mut app_name = "";
    let mut request_id = "";
    let mut client_timeout = None;
    for (name, value) in headers {
        let key = name.as_str();
        if key == "content-type" || key == "te" {
            continue;
        }
        if key.starts_with("grpc-") {
            if key == "grpc-encoding" && value.as_bytes() != b"identity" {
                return None;
            }
            if key == "grpc-timeout" {
                client_timeout = Some(frames::grpc_timeout(value.as_bytes())?);
            }
            continue; // grpc core keeps its own headers out of the invocation metadata
        }
        if key.ends_with("-bin") || key == "multiplexed_model_id" {
            return None;
        }
        let value = value.to_str().ok()?;
        match key {
            "application" => app_name = value,
            "request_id" => request_id = value,
            _ => {}
        }
        metadata.push((key.to_owned(), value.to_owned()));
    }
    let app = if state.apps.len() == 1 {
        state.apps.values().next()?.clone()
    } else {
        state.apps.get(app_name)?.clone()
    };
    let request_id = if request_id.is_empty() {
        Rid::Generated(routing::request_id())
    } else {
        Rid::Given(request_id.into())
    };
    Some(Head {
        method,
        app,
        metadata,
        request_id,
        client_timeout,
    })
}

async fn call(
    front: Rc<Front>,
    request: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    peer: Rc<String>,
) {
    if request.uri().path() == RELAY_PATH {
        return unimplemented(respond); // the private method is never reachable from outside
    }
    let Some(head) = covered(&front, &request) else {
        return Box::pin(hand_off(&front, request, Vec::new(), respond)).await;
    };
    let started = Instant::now();
    let (parts, mut body) = request.into_parts();
    // the whole request: one message (anything else: the Python server's)
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut size = 0usize;
    while let Some(chunk) = body.data().await {
        let Ok(chunk) = chunk else { return };
        let _ = body.flow_control().release_capacity(chunk.len());
        size += chunk.len();
        chunks.push(chunk);
        if size > MAX_NATIVE_MESSAGE + 5 {
            let request = Request::from_parts(parts, body);
            return Box::pin(hand_off(&front, request, chunks, respond)).await;
        }
    }
    let trailers_ok = matches!(body.trailers().await, Ok(None));
    let message = match &chunks[..] {
        [one] => one.clone(), // the usual case: no copy
        _ => {
            let mut whole = BytesMut::with_capacity(size);
            for c in &chunks {
                whole.extend_from_slice(c);
            }
            whole.freeze()
        }
    };
    let one = message.len() >= 5
        && message[0] == 0
        && u32::from_be_bytes(message[1..5].try_into().unwrap()) as usize == message.len() - 5;
    if !one || !trailers_ok {
        let request = Request::from_parts(parts, body);
        return Box::pin(hand_off(&front, request, chunks, respond)).await;
    }
    let Some(slot) = pick(&head.app.dep) else {
        let request = Request::from_parts(parts, body);
        return Box::pin(hand_off(&front, request, chunks, respond)).await;
    };
    let payload = fill(&head, &message[5..], &peer);
    let deadline = deadline(&front, &head);
    if head.method.streaming {
        let request = Request::from_parts(parts, ());
        return Box::pin(stream(
            &front, &head, slot, &payload, deadline, started, request, chunks, respond,
        ))
        .await;
    }
    // boxed: the call's future stays small (it is moved into its task whole)
    let limit = deadline.as_ref().map(|(limit, _)| *limit);
    let answering = Box::pin(call_replica_within(
        &front,
        &slot.0,
        &head.method.name,
        &payload,
        limit,
    ));
    let Some(answered) = unless_reset(&mut respond, answering).await else {
        // the client cancelled: the replica's connection was dropped with the call, which
        // cancels the method there; counted CANCELLED (as Ray counts a client's disconnect)
        drop(slot);
        return record(&front, &head, "CANCELLED", started);
    };
    drop(slot);
    match answered {
        Ok(Answer::Message(framed)) => {
            front.counters.borrow_mut().served += 1;
            send(respond, framed, ok_trailers(&head));
            record(&front, &head, "OK", started);
        }
        Ok(Answer::Python(status, body)) => {
            front.counters.borrow_mut().relayed += 1;
            Box::pin(relay(&front, &head, status, body, started, respond)).await;
        }
        Ok(Answer::NotStarted) => {
            Box::pin(hand_off_buffered(
                &front,
                Request::from_parts(parts, ()),
                chunks,
                respond,
            ))
            .await;
        }
        Ok(Answer::Lost) => {
            status_only(respond, 14, LOST);
            record(&front, &head, "UNAVAILABLE", started);
        }
        Err(_) => {
            let (_, details) = deadline.unwrap_or_default();
            status_only(respond, 4, &details);
            record(&front, &head, "DEADLINE_EXCEEDED", started);
        }
    }
}

const LOST: &str = "the replica closed the connection before answering";

/// `work`'s output, unless the client resets the call's stream first (None): `work` is dropped
/// then, and with it a replica call's connection, whose loss cancels the method in the replica.
async fn unless_reset<F: Future + Unpin>(
    respond: &mut SendResponse<Bytes>,
    mut work: F,
) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        if let Poll::Ready(out) = std::pin::Pin::new(&mut work).poll(cx) {
            return Poll::Ready(Some(out));
        }
        if respond.poll_reset(cx).is_ready() {
            return Poll::Ready(None);
        }
        Poll::Pending
    })
    .await
}

/// `grpc-status: 0` and the call's `request_id`.
fn ok_trailers(head: &Head) -> HeaderMap {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    if let Ok(v) = HeaderValue::from_str(head.request_id.as_str()) {
        trailers.insert("request_id", v);
    }
    trailers
}

/// When a call natively served ends DEADLINE_EXCEEDED, and the details it says: the sooner of
/// `grpc_options.request_timeout_s` (Ray's words) and the client's `grpc-timeout` (grpc core's).
fn deadline(front: &Front, head: &Head) -> Option<(Duration, String)> {
    let ours = front.request_timeout.get().map(|limit| {
        // as Python prints the float `grpc_options.request_timeout_s`
        let mut shown = format!("{}", limit.as_secs_f64());
        if !shown.contains('.') && !shown.contains('e') {
            shown.push_str(".0");
        }
        (limit, format!("Request timed out after {shown}s."))
    });
    let theirs = head
        .client_timeout
        .map(|limit| (limit, "Deadline Exceeded".to_owned()));
    match (ours, theirs) {
        (Some(a), Some(b)) => Some(if b.0 < a.0 { b } else { a }),
        (a, b) => a.or(b),
    }
}

fn push_str(out: &mut Vec<u8>, text: &str) {
    out.push(b'X'); // BINUNICODE
    out.extend_from_slice(&(text.len() as u32).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
}

/// The call's pickle: the method's template with its holes filled.
fn fill(head: &Head, data: &[u8], peer: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 512);
    for part in &head.method.template {
        match part {
            Part::Bytes(b) => out.extend_from_slice(b),
            Part::Hole(Hole::Data) => {
                out.push(b'B'); // BINBYTES
                out.extend_from_slice(&(data.len() as u32).to_le_bytes());
                out.extend_from_slice(data);
            }
            Part::Hole(Hole::Peer) => push_str(&mut out, peer),
            Part::Hole(Hole::RequestId) => push_str(&mut out, head.request_id.as_str()),
            Part::Hole(Hole::Metadata) => {
                out.extend_from_slice(b"](");
                for (k, v) in &head.metadata {
                    push_str(&mut out, k);
                    push_str(&mut out, v);
                    out.push(0x86); // TUPLE2
                }
                out.push(b'e'); // APPENDS
            }
        }
    }
    out
}

enum Answer {
    /// the reply as one gRPC message (its 5-byte prefix and the serialized reply)
    Message(Bytes),
    /// a pickle for Python: (HTTP status, body)
    Python(u16, Bytes),
    /// the replica did not start the call
    NotStarted,
    /// the connection was lost after the call was written
    Lost,
}

/// A handle call written to `replica` (`prefix`: `/-/call/` or `/-/stream/`) and the head of its
/// answer: the connection, the head and the plain bytes read so far (the head's included).
async fn open_call(
    front: &Front,
    replica: &Replica,
    prefix: &str,
    method: &str,
    body: &[u8],
    raw: &mut [u8],
) -> Result<(Channel, Parsed, Vec<u8>), Answer> {
    let mut ch = match routing::take_idle(&replica.idle_calls) {
        Some(ch) => ch,
        None => match channel::connect_as(
            &front.secret,
            &replica.host,
            replica.port,
            &replica.id,
            ROLE_CONTROL,
        )
        .await
        {
            Ok(ch) => ch,
            Err(_) => return Err(Answer::NotStarted),
        },
    };
    let head = format!(
        "POST {prefix}{method} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
        replica.host,
        replica.port,
        body.len()
    );
    let mut sealed = Vec::with_capacity(head.len() + body.len() + 64);
    ch.sealer
        .seal_parts_into(&[head.as_bytes(), body], &mut sealed);
    if ch.stream.write_all(&sealed).await.is_err() {
        return Err(Answer::Lost);
    }
    let mut plain = Vec::with_capacity(raw.len());
    loop {
        let n = match ch.stream.read(raw).await {
            Ok(0) | Err(_) => return Err(Answer::Lost),
            Ok(n) => n,
        };
        if ch.opener.feed(&raw[..n], &mut plain).is_err() {
            return Err(Answer::Lost);
        }
        match parse_answer(&plain, false) {
            ParsedAnswer::Partial => {}
            ParsedAnswer::Bad => return Err(Answer::Lost),
            ParsedAnswer::Head(a) => return Ok((ch, a, plain)),
        }
    }
}

/// The rest of a `Content-Length` answer, read through `raw` into `plain` (the answer whole,
/// its body at `answer.head_len`); the connection pooled again when the replica keeps it.
async fn length_body(
    replica: &Replica,
    mut ch: Channel,
    answer: &Parsed,
    mut plain: Vec<u8>,
    raw: &mut [u8],
) -> Result<Vec<u8>, Answer> {
    let Framing::Length(n) = answer.framing else {
        return Err(Answer::Lost);
    };
    while plain.len() < answer.head_len + n {
        let got = match ch.stream.read(raw).await {
            Ok(0) | Err(_) => return Err(Answer::Lost),
            Ok(got) => got,
        };
        if ch.opener.feed(&raw[..got], &mut plain).is_err() {
            return Err(Answer::Lost);
        }
    }
    if plain.len() != answer.head_len + n {
        return Err(Answer::Lost);
    }
    if !answer.close {
        ch.opener.trim();
        replica.idle_calls.borrow_mut().push(ch);
    }
    Ok(plain)
}

/// `call_replica`, ended at `limit` (Err) if any.
async fn call_replica_within(
    front: &Front,
    replica: &Replica,
    method: &str,
    body: &[u8],
    limit: Option<Duration>,
) -> Result<Answer, tokio::time::error::Elapsed> {
    match limit {
        None => Ok(call_replica(front, replica, method, body).await),
        Some(limit) => {
            tokio::time::timeout(limit, call_replica(front, replica, method, body)).await
        }
    }
}

/// Bytes read from a replica per read of a handle call's answer (one buffer per call).
const CALL_READ: usize = 16 * 1024;

async fn call_replica(front: &Front, replica: &Replica, method: &str, body: &[u8]) -> Answer {
    let mut raw = vec![0u8; CALL_READ];
    let opened = open_call(front, replica, "/-/call/", method, body, &mut raw).await;
    let (ch, answer, plain) = match opened {
        Ok(opened) => opened,
        Err(failed) => return failed,
    };
    let mut plain = match length_body(replica, ch, &answer, plain, &mut raw).await {
        Ok(plain) => plain,
        Err(failed) => return failed,
    };
    if answer.unserved {
        return Answer::NotStarted;
    }
    let at = answer.head_len;
    if answer.status == 200 && plain.get(at) == Some(&b'M') && at >= 4 {
        // framed where it was read: the gRPC message prefix (uncompressed, its length) over
        // the head's last bytes and the `M`
        let len = (plain.len() - at - 1) as u32;
        plain[at - 4] = 0;
        plain[at - 3..at + 1].copy_from_slice(&len.to_be_bytes());
        return Answer::Message(Bytes::from(plain).slice(at - 4..));
    }
    Answer::Python(answer.status, Bytes::from(plain).slice(at..))
}

fn record(front: &Front, head: &Head, code: &'static str, started: Instant) {
    crate::memory::note();
    let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
    let bounds = front.buckets.borrow();
    let mut c = front.counters.borrow_mut();
    let key = (
        Rc::as_ptr(&head.method) as usize,
        Rc::as_ptr(&head.app) as usize,
        code,
    );
    c.records
        .entry(key)
        .or_insert_with(|| Record {
            method: head.method.clone(),
            app: head.app.clone(),
            pending: Pending::new(&bounds),
        })
        .pending
        .add(&bounds, latency_ms);
    drop(c);
    let mut access = front.access.borrow_mut();
    if access.on() {
        let (method, app) = (&head.method.full, &head.app.name);
        let at = routing::unix_time();
        access.add(at, method, app, code, latency_ms, head.request_id.as_str());
    }
}

/// The head of an answer with messages (200, `application/grpc`); None when the client left.
fn open_answer(mut respond: SendResponse<Bytes>) -> Option<SendStream<Bytes>> {
    let response = Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .body(())
        .expect("a valid response");
    respond.send_response(response, false).ok()
}

fn send(respond: SendResponse<Bytes>, message: Bytes, trailers: HeaderMap) {
    let Some(mut stream) = open_answer(respond) else {
        return;
    };
    let _ = stream.send_data(message, false);
    let _ = stream.send_trailers(trailers);
}

/// A trailers-only answer with a status (grpc-core's spelling of its details).
fn status_only(mut respond: SendResponse<Bytes>, code: u8, details: &str) {
    let mut response = Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .header("grpc-status", code.to_string());
    let encoded = percent_encode(details);
    if let Ok(v) = HeaderValue::from_str(&encoded) {
        response = response.header("grpc-message", v);
    }
    let _ = respond.send_response(response.body(()).expect("a valid response"), true);
}

fn unimplemented(respond: SendResponse<Bytes>) {
    status_only(respond, 12, "Method not found!");
}

fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

// -- the Python listener ----------------------------------------------------------------------

async fn python(front: &Front) -> Option<h2::client::SendRequest<Bytes>> {
    if let Some(client) = front.python.borrow().clone() {
        return Some(client);
    }
    let client = match front.fallback.strip_prefix("unix:") {
        Some(path) => python_over(UnixStream::connect(path).await.ok()?).await?,
        None => {
            let tcp = TcpStream::connect(&front.fallback).await.ok()?;
            let _ = tcp.set_nodelay(true);
            python_over(tcp).await?
        }
    };
    *front.python.borrow_mut() = Some(client.clone());
    Some(client)
}

async fn python_over<T>(io: T) -> Option<h2::client::SendRequest<Bytes>>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + 'static,
{
    let (client, conn) = h2::client::Builder::new()
        .initial_window_size(1 << 20)
        .initial_connection_window_size(1 << 22)
        .handshake::<_, Bytes>(io)
        .await
        .ok()?;
    tokio::task::spawn_local(async move {
        let _ = conn.await;
    });
    Some(client)
}

/// The connection to the Python listener, ready for a call: one the server closed (GOAWAY) is
/// remade once.
async fn python_ready(front: &Front) -> Option<h2::client::SendRequest<Bytes>> {
    for _ in 0..2 {
        let client = python(front).await?;
        match client.ready().await {
            Ok(client) => return Some(client),
            Err(_) => *front.python.borrow_mut() = None,
        }
    }
    None
}

/// The call, its head as the client sent it, to the Python listener: `body` was read already,
/// `rest` follows; the answer is relayed to the client as it comes.
async fn forward(
    front: &Front,
    parts: http::request::Parts,
    read: Vec<Bytes>,
    rest: Option<RecvStream>,
    mut respond: SendResponse<Bytes>,
) {
    let Some(mut client) = python_ready(front).await else {
        return status_only(respond, 14, "the proxy's gRPC server is unreachable");
    };
    let mut request = Request::builder()
        .method(parts.method)
        .uri(format!("http://localhost{}", parts.uri.path()))
        .body(())
        .expect("a valid request");
    *request.headers_mut() = parts.headers;
    let ends = rest.is_none() && read.is_empty();
    let (answer, mut upload) = match client.send_request(request, ends) {
        Ok(pair) => pair,
        Err(_) => {
            *front.python.borrow_mut() = None;
            return status_only(respond, 14, "the proxy's gRPC server is unreachable");
        }
    };
    if !ends {
        let count = read.len();
        for (i, chunk) in read.into_iter().enumerate() {
            let last = rest.is_none() && i + 1 == count;
            let _ = upload.send_data(chunk, last);
        }
        if let Some(mut rest) = rest {
            tokio::task::spawn_local(async move {
                if !pipe(&mut rest, &mut upload).await {
                    return;
                }
                match rest.trailers().await {
                    Ok(Some(t)) => {
                        let _ = upload.send_trailers(t);
                    }
                    _ => {
                        let _ = upload.send_data(Bytes::new(), true);
                    }
                }
            });
        }
    }
    let Ok(answer) = answer.await else {
        return status_only(respond, 14, "the proxy's gRPC server closed the call");
    };
    let (head, mut body) = answer.into_parts();
    let ends = body.is_end_stream();
    let Ok(mut download) = respond.send_response(Response::from_parts(head, ()), ends) else {
        return;
    };
    if ends {
        return;
    }
    if !pipe(&mut body, &mut download).await {
        return;
    }
    match body.trailers().await {
        Ok(Some(t)) => {
            let _ = download.send_trailers(t);
        }
        _ => {
            let _ = download.send_data(Bytes::new(), true);
        }
    }
}

/// Moves a stream's DATA from `recv` to `send` at the pace `send`'s peer takes it, HTTP/2 flow
/// control end to end: the next chunk is read only once `send` has window for some of it, and
/// its bytes are given back to `recv`'s sender only once handed on, so about a window per stream
/// waits here whatever the two peers' speeds (a client stream the method reads slowly holds its
/// client, instead of piling up in this process). True at the end of the DATA (trailers may
/// follow), false when either side failed.
async fn pipe(recv: &mut RecvStream, send: &mut SendStream<Bytes>) -> bool {
    loop {
        send.reserve_capacity(1);
        while send.capacity() == 0 {
            match std::future::poll_fn(|cx| send.poll_capacity(cx)).await {
                Some(Ok(_)) => {}
                _ => return false,
            }
        }
        let Some(chunk) = recv.data().await else {
            return true;
        };
        let Ok(chunk) = chunk else { return false };
        let len = chunk.len();
        send.reserve_capacity(len);
        if send.send_data(chunk, false).is_err() {
            return false;
        }
        let _ = recv.flow_control().release_capacity(len);
    }
}

async fn hand_off(
    front: &Front,
    request: Request<RecvStream>,
    read: Vec<Bytes>,
    respond: SendResponse<Bytes>,
) {
    front.counters.borrow_mut().handed_off += 1;
    let (parts, body) = request.into_parts();
    let rest = if body.is_end_stream() && read.is_empty() {
        None
    } else {
        Some(body)
    };
    forward(front, parts, read, rest, respond).await;
}

async fn hand_off_buffered(
    front: &Front,
    request: Request<()>,
    read: Vec<Bytes>,
    respond: SendResponse<Bytes>,
) {
    front.counters.borrow_mut().handed_off += 1;
    let (parts, ()) = request.into_parts();
    forward(front, parts, read, None, respond).await;
}

/// The replica's pickled answer to the Python listener's relay method, signed.
async fn relay(
    front: &Front,
    head: &Head,
    status: u16,
    body: Bytes,
    started: Instant,
    respond: SendResponse<Bytes>,
) {
    let Some((request, message)) = relay_request(front, head, status, &body, started, false) else {
        return status_only(respond, 13, "unprintable call fields");
    };
    let (parts, ()) = request.into_parts();
    forward(front, parts, vec![message], None, respond).await;
}

/// The relay call of a replica's answer (`status`, `body`), signed with the data-plane secret
/// (HMAC-SHA256 over the fields and the body); `item`: one item of a stream the native front
/// serves (answered with the message, the context as `x-kubeserve-*` trailers, not counted).
fn relay_request(
    front: &Front,
    head: &Head,
    status: u16,
    body: &[u8],
    started: Instant,
    item: bool,
) -> Option<(Request<()>, Bytes)> {
    let mut fields = [
        head.method.full.as_str(),
        head.app.name.as_str(),
        head.app.dep.key.as_str(),
        head.request_id.as_str(),
        &status.to_string(),
        &format!("{:.3}", started.elapsed().as_secs_f64() * 1000.0),
    ]
    .join("\n");
    if item {
        fields.push_str("\nitem");
    }
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&front.secret).expect("any key");
    mac.update(b"kubeserve-grpc-relay\n");
    mac.update(fields.as_bytes());
    mac.update(b"\n");
    mac.update(body);
    let signature: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut message = BytesMut::with_capacity(body.len() + 5);
    message.extend_from_slice(&[0]);
    message.extend_from_slice(&(body.len() as u32).to_be_bytes());
    message.extend_from_slice(body);
    let mut request = Request::builder()
        .method("POST")
        .uri(RELAY_PATH)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("a valid request");
    let headers = request.headers_mut();
    for (name, value) in [
        ("x-kubeserve-relay", fields.replace('\n', "\t")),
        ("x-kubeserve-signature", signature),
    ] {
        headers.insert(name, HeaderValue::from_str(&value).ok()?);
    }
    Some((request, message.freeze()))
}

/// A relay call's whole answer: its messages (gRPC-framed) and its status (the trailers, or the
/// head of a trailers-only answer). The answer is one item's message at most, already held here.
async fn relay_collect(
    front: &Front,
    request: Request<()>,
    message: Bytes,
) -> Option<(Vec<Bytes>, HeaderMap)> {
    let mut client = python_ready(front).await?;
    let (parts, ()) = request.into_parts();
    let mut request = Request::builder()
        .method(parts.method)
        .uri(format!("http://localhost{}", parts.uri.path()))
        .body(())
        .expect("a valid request");
    *request.headers_mut() = parts.headers;
    let (answer, mut upload) = client.send_request(request, false).ok()?;
    upload.send_data(message, true).ok()?;
    let (head, mut body) = answer.await.ok()?.into_parts();
    if head.headers.contains_key("grpc-status") {
        return Some((Vec::new(), head.headers));
    }
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.ok()?;
        let _ = body.flow_control().release_capacity(chunk.len());
        data.push(chunk);
    }
    Some((data, body.trailers().await.ok()??))
}

// -- server-streaming calls -------------------------------------------------------------------

/// Largest frame of a stream held whole (an item whose method changed its context, an error):
/// those go to Python, and a message the method yielded bare passes through in pieces.
const MAX_WHOLE_FRAME: usize = 64 * 1024 * 1024;
/// Messages read in one go are sent to the client in DATA frames of up to this many bytes.
const COALESCE: usize = 32 * 1024;

/// How a natively served stream ended.
enum Ended {
    /// the end frame: the status to send (`grpc-status` in the trailers)
    Done(HeaderMap, &'static str),
    /// the method raised: Python answered the status (and counted the call)
    Relayed(HeaderMap),
    /// the client reset the stream
    Cancelled,
    /// the replica's answer broke off, or was not one
    Broken(&'static str),
}

/// A server-streaming call served natively: `POST /-/stream/<method>` to the chosen replica,
/// each item the method yields bare (`M`) relayed as a message as it comes, in pieces, never
/// more held than one read of the replica's connection (HTTP/2 flow control: the replica is
/// read only once the client's window took what was read); an item with a changed context or
/// an error goes to Python's relay method. Ends at the deadline (DEADLINE_EXCEEDED) or when
/// the client resets the stream (the replica's connection is closed: its generator stops).
#[allow(clippy::too_many_arguments)]
async fn stream(
    front: &Front,
    head: &Head,
    slot: Slot,
    payload: &[u8],
    deadline: Option<(Duration, String)>,
    started: Instant,
    request: Request<()>,
    chunks: Vec<Bytes>,
    mut respond: SendResponse<Bytes>,
) {
    let at = deadline
        .as_ref()
        .map(|(limit, _)| tokio::time::Instant::from_std(started) + *limit);
    let mut raw = vec![0u8; CALL_READ];
    let opening = open_call(
        front,
        &slot.0,
        "/-/stream/",
        &head.method.name,
        payload,
        &mut raw,
    );
    let opening = Box::pin(async {
        match at {
            None => Ok(opening.await),
            Some(at) => tokio::time::timeout_at(at, opening).await,
        }
    });
    let Some(opened) = unless_reset(&mut respond, opening).await else {
        return record(front, head, "CANCELLED", started); // before the first item
    };
    let (ch, answer, plain) = match opened {
        Err(_) => {
            let (_, details) = deadline.unwrap_or_default();
            status_only(respond, 4, &details);
            return record(front, head, "DEADLINE_EXCEEDED", started);
        }
        Ok(Err(Answer::NotStarted)) => {
            drop(slot);
            return hand_off_buffered(front, request, chunks, respond).await;
        }
        Ok(Err(_)) => {
            status_only(respond, 14, LOST);
            return record(front, head, "UNAVAILABLE", started);
        }
        Ok(Ok(opened)) => opened,
    };
    if answer.unserved {
        drop((slot, ch));
        return hand_off_buffered(front, request, chunks, respond).await;
    }
    if answer.status != 200 || !matches!(answer.framing, Framing::Chunked) {
        // the method raised before its first item (500), or the replica refused the call
        let body = match length_body(&slot.0, ch, &answer, plain, &mut raw).await {
            Ok(plain) => Bytes::from(plain).slice(answer.head_len..),
            Err(_) => {
                status_only(respond, 14, LOST);
                return record(front, head, "UNAVAILABLE", started);
            }
        };
        drop(slot);
        front.counters.borrow_mut().relayed += 1;
        return relay(front, head, answer.status, body, started, respond).await;
    }
    drop(raw); // the stream reads through a buffer of its own
    let Some(mut out) = open_answer(respond) else {
        return;
    };
    let mut ch = ch;
    let mut dechunker = Dechunker::default();
    let pumped = pump(
        front,
        head,
        started,
        &mut ch,
        &mut dechunker,
        &plain[answer.head_len..],
        &mut out,
    );
    let ended = match at {
        None => pumped.await,
        Some(at) => match tokio::time::timeout_at(at, pumped).await {
            Ok(ended) => ended,
            Err(_) => {
                let (_, details) = deadline.unwrap_or_default();
                let _ = out.send_trailers(status_trailers(4, &details));
                return record(front, head, "DEADLINE_EXCEEDED", started);
            }
        },
    };
    match ended {
        Ended::Done(trailers, code) => {
            let _ = out.send_trailers(trailers);
            front.counters.borrow_mut().served += 1;
            record(front, head, code, started);
            let replica = slot.0.clone();
            drop(slot);
            // the answer's last bytes (the chunked end) may follow the end frame: then the
            // connection serves the next call
            let finished =
                tokio::time::timeout(Duration::from_secs(1), finish(&mut ch, &mut dechunker));
            if matches!(finished.await, Ok(true)) && !answer.close {
                ch.opener.trim();
                replica.idle_calls.borrow_mut().push(ch);
            }
        }
        Ended::Relayed(trailers) => {
            front.counters.borrow_mut().relayed += 1;
            let _ = out.send_trailers(trailers);
        }
        Ended::Cancelled => record(front, head, "CANCELLED", started),
        Ended::Broken(details) => {
            let _ = out.send_trailers(status_trailers(14, details));
            record(front, head, "UNAVAILABLE", started);
        }
    }
}

/// Read the rest of a chunked answer whose end frame came: true when it ended cleanly.
async fn finish(ch: &mut Channel, dechunker: &mut Dechunker) -> bool {
    let mut raw = vec![0u8; 1024];
    let mut plain = Vec::new();
    let mut body = Vec::new();
    loop {
        match dechunker.feed(&plain, &mut body) {
            Ok(true) => return body.is_empty(),
            Ok(false) if body.is_empty() => {}
            _ => return false,
        }
        plain.clear();
        match ch.stream.read(&mut raw).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => {
                if ch.opener.feed(&raw[..n], &mut plain).is_err() {
                    return false;
                }
            }
        }
    }
}

/// The frames of the replica's answer to the client, until the end frame, an error frame, a
/// broken answer or the client's reset.
async fn pump(
    front: &Front,
    head: &Head,
    started: Instant,
    ch: &mut Channel,
    dechunker: &mut Dechunker,
    first: &[u8],
    out: &mut SendStream<Bytes>,
) -> Ended {
    let mut cutter = FrameCutter::new(MAX_WHOLE_FRAME);
    let mut body = Vec::new();
    let Ok(mut ended) = dechunker.feed(first, &mut body) else {
        return Ended::Broken(LOST);
    };
    cutter.push(&body);
    let mut pending = BytesMut::new();
    let mut context: Option<HeaderMap> = None;
    let mut raw = vec![0u8; 64 * 1024];
    let mut plain = Vec::with_capacity(64 * 1024);
    loop {
        loop {
            let piece = match cutter.next() {
                Ok(Some(piece)) => piece,
                Ok(None) => break,
                Err(_) => return Ended::Broken(LOST),
            };
            match piece {
                Piece::MessageStart(len) => {
                    pending.extend_from_slice(&[0]);
                    pending.extend_from_slice(&(len as u32).to_be_bytes());
                }
                Piece::Bytes(b) => pending.extend_from_slice(&b),
                Piece::End => {
                    if send_capped(out, &mut pending).await.is_err() {
                        return Ended::Cancelled;
                    }
                    return match context {
                        None => Ended::Done(ok_trailers(head), "OK"),
                        Some(trailers) => context_status(trailers),
                    };
                }
                Piece::Whole(kind, frame) => {
                    if send_capped(out, &mut pending).await.is_err() {
                        return Ended::Cancelled;
                    }
                    let status = if kind == b'E' { 500 } else { 200 };
                    let Some((request, message)) =
                        relay_request(front, head, status, &frame, started, kind == b'I')
                    else {
                        return Ended::Broken("unprintable call fields");
                    };
                    let Some((data, trailers)) = relay_collect(front, request, message).await
                    else {
                        return Ended::Broken("the proxy's gRPC server is unreachable");
                    };
                    if kind == b'E' {
                        return Ended::Relayed(status_of(trailers));
                    }
                    for d in data {
                        if d.first() != Some(&0) {
                            return Ended::Broken("a compressed message from the relay");
                        }
                        pending.extend_from_slice(&d);
                    }
                    context = Some(trailers);
                }
            }
            if pending.len() >= COALESCE && send_capped(out, &mut pending).await.is_err() {
                return Ended::Cancelled;
            }
        }
        if ended {
            return Ended::Broken(LOST); // the answer ended without its end frame
        }
        if send_capped(out, &mut pending).await.is_err() {
            return Ended::Cancelled;
        }
        let n = tokio::select! {
            read = ch.stream.read(&mut raw) => match read {
                Ok(0) | Err(_) => return Ended::Broken(LOST),
                Ok(n) => n,
            },
            _ = std::future::poll_fn(|cx| out.poll_reset(cx)) => return Ended::Cancelled,
        };
        plain.clear();
        if ch.opener.feed(&raw[..n], &mut plain).is_err() {
            return Ended::Broken(LOST);
        }
        body.clear();
        match dechunker.feed(&plain, &mut body) {
            Ok(done) => ended = done,
            Err(()) => return Ended::Broken(LOST),
        }
        cutter.push(&body);
    }
}

/// Send `pending` as the client's window allows (HTTP/2 flow control): Err when the client
/// reset the stream.
async fn send_capped(out: &mut SendStream<Bytes>, pending: &mut BytesMut) -> Result<(), ()> {
    while !pending.is_empty() {
        out.reserve_capacity(pending.len());
        let capacity = std::future::poll_fn(|cx| {
            if out.poll_reset(cx).is_ready() {
                return Poll::Ready(Err(()));
            }
            if out.capacity() > 0 {
                return Poll::Ready(Ok(out.capacity()));
            }
            match out.poll_capacity(cx) {
                Poll::Ready(Some(Ok(n))) if n > 0 => Poll::Ready(Ok(n)),
                Poll::Ready(Some(Ok(_))) => Poll::Pending,
                Poll::Ready(Some(Err(_)) | None) => Poll::Ready(Err(())),
                Poll::Pending => Poll::Pending,
            }
        })
        .await?;
        let chunk = pending.split_to(capacity.min(pending.len())).freeze();
        out.send_data(chunk, false).map_err(|_| ())?;
    }
    Ok(())
}

/// The trailers of a stream whose items came with a changed context (the last one's, as the
/// relay answered it: `x-kubeserve-code` and `-details`, the trailing metadata as is).
fn context_status(relayed: HeaderMap) -> Ended {
    let mut trailers = HeaderMap::new();
    let mut code = 0u32;
    let mut details = String::new();
    for (name, value) in &relayed {
        match name.as_str() {
            "x-kubeserve-code" => {
                code = value
                    .to_str()
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(2)
            }
            "x-kubeserve-details" => details = value.to_str().unwrap_or_default().to_owned(),
            "grpc-status" | "grpc-message" | "content-type" => {}
            _ => {
                trailers.append(name.clone(), value.clone());
            }
        }
    }
    let mut status = HeaderMap::new();
    status.insert("grpc-status", HeaderValue::from(code.min(16) as u16));
    if let Ok(v) = HeaderValue::from_str(&details) {
        if !details.is_empty() {
            status.insert("grpc-message", v); // percent-encoded by the relay already
        }
    }
    for (name, value) in &trailers {
        status.append(name.clone(), value.clone());
    }
    Ended::Done(status, frames::code_name(code))
}

/// A relay answer's status and trailing metadata, as trailers (without what only a head has).
fn status_of(mut headers: HeaderMap) -> HeaderMap {
    headers.remove("content-type");
    headers
}

fn status_trailers(code: u8, details: &str) -> HeaderMap {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from(code as u16));
    if let Ok(v) = HeaderValue::from_str(&percent_encode(details)) {
        trailers.insert("grpc-message", v);
    }
    trailers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_encoding_keeps_printable_ascii() {
        assert_eq!(percent_encode("a b%\n"), "a b%25%0A");
    }

    #[test]
    fn unhex_round_trips() {
        assert_eq!(unhex("00ff10"), Some(vec![0, 255, 16]));
        assert_eq!(unhex("0"), None);
    }
}
