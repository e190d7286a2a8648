//! What the HTTP front (`serve.rs`) and the gRPC front (`grpc.rs`) share: the replicas of the
//! discovery snapshot, the load exchanged with the Python proxy, the replica choice, the control
//! socket's line protocol and the metric records.
//!
//! One `Registry` per process, shared by both fronts: a replica is one `Replica` whichever front
//! calls it, so its requests in flight (`ongoing`) count both fronts' calls, against one
//! `max_ongoing_requests`, and the `load` op (on the HTTP front's control socket) reports them
//! all to the Python proxy and sets what the Python proxy has in flight (`external`).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io;
use std::rc::Rc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::access::AccessLines;
use crate::channel::{self, Channel};

pub struct Replica {
    pub id: String,
    pub host: String,
    pub port: u16,
    /// requests this process (either front) has in flight on it
    pub ongoing: Cell<u32>,
    /// requests the Python proxy has in flight on it (pushed with `load`)
    pub external: Cell<u32>,
    /// idle INGRESS connections (the HTTP front's forwarded requests)
    pub idle: RefCell<Vec<Channel>>,
    /// idle CONTROL connections (the gRPC front's handle calls)
    pub idle_calls: RefCell<Vec<Channel>>,
}

impl Replica {
    /// What the replica runs for this proxy: both processes' requests, against one cap.
    pub fn load(&self) -> u32 {
        self.ongoing.get() + self.external.get()
    }
}

/// A pooled connection the replica has not closed meanwhile (its keep-alive timeout), if any.
pub fn take_idle(pool: &RefCell<Vec<Channel>>) -> Option<Channel> {
    let mut idle = pool.borrow_mut();
    while let Some(ch) = idle.pop() {
        if !ch.stream.closed_while_idle() {
            return Some(ch);
        } // else: dropped
    }
    None
}

pub struct Deployment {
    /// `app#deployment`
    pub key: String,
    /// the route its requests' access lines name: the last route of the snapshot to it, as the
    /// Python proxy's `labels`
    pub route: String,
    pub max_ongoing: u32,
    pub replicas: Vec<Rc<Replica>>,
    /// a custom request router (Ray's `request_router_class`) chooses in the Python proxy:
    /// the fronts leave its calls to it
    pub custom_router: bool,
}

/// One route of a snapshot: its prefix, application and deployment (an index of `Routes`).
pub struct Route {
    pub prefix: String,
    pub app: String,
    pub deployment: usize,
}

/// A discovery snapshot (`kubeserve.runtime.wire.Snapshot`) as the fronts route by it.
pub struct Routes {
    pub routes: Vec<Route>,
    pub deployments: Vec<Rc<Deployment>>,
}

/// The replicas of the newest snapshot, by id, shared by both fronts.
#[derive(Default)]
pub struct Registry {
    replicas: RefCell<HashMap<String, Rc<Replica>>>,
}

impl Registry {
    /// Parse a snapshot; a replica already known (same id, host and port) is kept, with its
    /// counts and idle connections; replicas no longer in it are forgotten (their idle
    /// connections close with the last front that drops them).
    pub fn install(&self, snap: &Value) -> Result<Routes, String> {
        let routes = snap
            .get("routes")
            .and_then(Value::as_array)
            .ok_or("snapshot.routes: not a list")?;
        let deps = snap
            .get("deployments")
            .and_then(Value::as_object)
            .ok_or("snapshot.deployments: not an object")?;
        let mut known = self.replicas.borrow_mut();
        let mut live: HashMap<String, Rc<Replica>> = HashMap::new();
        let mut out = Routes {
            routes: Vec::new(),
            deployments: Vec::new(),
        };
        let mut index: HashMap<String, usize> = HashMap::new();
        let mut labels: HashMap<String, &str> = HashMap::new();
        for r in routes {
            if let (Some(prefix), Some(app), Some(dep)) = (
                r.get("route_prefix").and_then(Value::as_str),
                r.get("app").and_then(Value::as_str),
                r.get("deployment").and_then(Value::as_str),
            ) {
                labels.insert(format!("{app}#{dep}"), prefix);
            }
        }
        for (i, r) in routes.iter().enumerate() {
            let field = |name: &str| {
                r.get(name)
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .ok_or_else(|| format!("snapshot.routes[{i}].{name}: not a string"))
            };
            let prefix = field("route_prefix")?;
            let app = field("app")?;
            let key = format!("{app}#{}", field("deployment")?);
            let Some(dep) = deps.get(&key) else { continue };
            let d = match index.get(&key) {
                Some(&d) => d,
                None => {
                    let route = labels.get(&key).copied().unwrap_or_default();
                    let parsed = parse_deployment(&key, route, dep, &known, &mut live)?;
                    out.deployments.push(Rc::new(parsed));
                    index.insert(key, out.deployments.len() - 1);
                    out.deployments.len() - 1
                }
            };
            out.routes.push(Route {
                prefix,
                app,
                deployment: d,
            });
        }
        *known = live;
        Ok(out)
    }

    /// The Python proxy's requests in flight per replica id (`in_flight`; a replica not named
    /// has none) replace the last ones; the answer is ours (replicas with none left out), so each
    /// side chooses with both counts and neither goes over `max_ongoing_requests` for long.
    pub fn apply_load(&self, msg: &Value) -> Result<serde_json::Map<String, Value>, String> {
        let theirs = msg
            .get("in_flight")
            .and_then(Value::as_object)
            .ok_or("in_flight: not an object")?;
        let mut ours = serde_json::Map::new();
        for (id, replica) in self.replicas.borrow().iter() {
            let n = theirs.get(id).and_then(Value::as_u64).unwrap_or(0);
            replica.external.set(n.min(u32::MAX as u64) as u32);
            if replica.ongoing.get() > 0 {
                ours.insert(id.clone(), json!(replica.ongoing.get()));
            }
        }
        Ok(ours)
    }
}

fn parse_deployment(
    key: &str,
    route: &str,
    dep: &Value,
    known: &HashMap<String, Rc<Replica>>,
    live: &mut HashMap<String, Rc<Replica>>,
) -> Result<Deployment, String> {
    let max_ongoing = dep
        .get("max_ongoing_requests")
        .and_then(Value::as_u64)
        .unwrap_or(5);
    let mut replicas = Vec::new();
    for (j, ep) in dep
        .get("replicas")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let where_ = format!("snapshot.deployments.{key}.replicas[{j}]");
        let id = ep
            .get("replica_id")
            .and_then(Value::as_str)
            .ok_or(format!("{where_}.replica_id"))?;
        let host = ep
            .get("host")
            .and_then(Value::as_str)
            .ok_or(format!("{where_}.host"))?;
        let port = ep
            .get("port")
            .and_then(Value::as_u64)
            .filter(|p| *p < 65536)
            .ok_or(format!("{where_}.port"))?;
        let replica = match known.get(id) {
            Some(r) if r.host == host && r.port == port as u16 => r.clone(),
            _ => Rc::new(Replica {
                id: id.to_owned(),
                host: host.to_owned(),
                port: port as u16,
                ongoing: Cell::new(0),
                external: Cell::new(0),
                idle: RefCell::new(Vec::new()),
                idle_calls: RefCell::new(Vec::new()),
            }),
        };
        live.insert(id.to_owned(), replica.clone());
        replicas.push(replica);
    }
    Ok(Deployment {
        key: key.to_owned(),
        route: route.to_owned(),
        max_ongoing: max_ongoing.min(u32::MAX as u64) as u32,
        replicas,
        custom_router: dep.get("request_router").is_some(),
    })
}

/// A request in flight on a replica: counted in `ongoing` until dropped.
pub struct Slot(pub Rc<Replica>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.ongoing.set(self.0.ongoing.get() - 1);
    }
}

/// A replica with room, as the Python proxy's router (`router._two_choices`): of two distinct
/// random replicas the less loaded (this process's requests and the Python proxy's, `load`), if
/// below `max_ongoing_requests`; else the least loaded with room; else none (the request is
/// handed to the Python proxy, which queues it).
pub fn pick(dep: &Deployment) -> Option<Slot> {
    let replicas = &dep.replicas;
    let cap = dep.max_ongoing;
    let chosen = match replicas.len() {
        0 => return None,
        1 => Some(&replicas[0]).filter(|r| r.load() < cap),
        n => {
            let x = random_u64();
            let i = (x % n as u64) as usize;
            let mut j = ((x >> 32) % (n as u64 - 1)) as usize;
            if j >= i {
                j += 1; // distinct from the first, still uniform
            }
            let (a, b) = (&replicas[i], &replicas[j]);
            let a = if b.load() < a.load() { b } else { a };
            if a.load() < cap {
                Some(a)
            } else {
                replicas
                    .iter()
                    .filter(|r| r.load() < cap)
                    .min_by_key(|r| r.load())
            }
        }
    }?;
    chosen.ongoing.set(chosen.ongoing.get() + 1);
    Some(Slot(chosen.clone()))
}

/// xorshift64*, seeded from the OS: for request ids (unique, not secret, as
/// `http1.new_request_id`) and replica choice.
pub fn random_u64() -> u64 {
    thread_local! {
        static STATE: Cell<u64> = Cell::new(u64::from_le_bytes(channel::nonce()[..8].try_into().unwrap()) | 1);
    }
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        x.wrapping_mul(0x2545F4914F6CDD1D)
    })
}

/// A new request id: 32 lowercase hex digits.
pub fn request_id() -> [u8; 32] {
    let mut out = [0u8; 32];
    let words = [random_u64(), random_u64()];
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, byte) in words[0]
        .to_le_bytes()
        .iter()
        .chain(words[1].to_le_bytes().iter())
        .enumerate()
    {
        out[2 * i] = HEX[(byte >> 4) as usize];
        out[2 * i + 1] = HEX[(byte & 15) as usize];
    }
    out
}

// -- settings both fronts take with a snapshot ------------------------------------------------

/// `latency_buckets_ms`, `request_timeout_s` and `access_log` (with `access_format`) of a
/// `state` op, when present.
pub struct Common<'a> {
    pub buckets: &'a RefCell<Vec<f64>>,
    pub request_timeout: &'a Cell<Option<Duration>>,
    pub access: &'a RefCell<AccessLines>,
}

impl Common<'_> {
    pub fn apply(&self, msg: &Value) -> Result<(), String> {
        if let Some(b) = msg.get("latency_buckets_ms") {
            let bounds: Option<Vec<f64>> = b
                .as_array()
                .and_then(|a| a.iter().map(Value::as_f64).collect());
            *self.buckets.borrow_mut() =
                bounds.ok_or("latency_buckets_ms: not a list of numbers")?;
        }
        match msg.get("request_timeout_s") {
            None => {}
            Some(Value::Null) => self.request_timeout.set(None),
            Some(v) => match v.as_f64().filter(|s| *s > 0.0 && s.is_finite()) {
                Some(s) => self.request_timeout.set(Some(Duration::from_secs_f64(s))),
                None => return Err("request_timeout_s: not a positive number or null".into()),
            },
        }
        self.access.borrow_mut().apply(msg)
    }
}

impl AccessLines {
    /// `access_log` (and with true, `access_format`: `{"json": bool, "component": str}`) of a
    /// `state` op, when present.
    pub fn apply(&mut self, msg: &Value) -> Result<(), String> {
        match msg.get("access_log").and_then(Value::as_bool) {
            None => {}
            Some(false) => self.set_format(None),
            Some(true) => {
                let given = msg
                    .get("access_format")
                    .ok_or("access_format: missing with access_log true")?;
                let json = given
                    .get("json")
                    .and_then(Value::as_bool)
                    .ok_or("access_format.json: not a boolean")?;
                let component = given
                    .get("component")
                    .and_then(Value::as_str)
                    .ok_or("access_format.component: not a string")?;
                self.set_format(Some((json, component)));
            }
        }
        Ok(())
    }
}

// -- records ----------------------------------------------------------------------------------

/// Requests of one label set since the last `take_records`: Ray's metrics, recorded by the
/// Python proxy (`ProxyMetrics.add_batch`, `GrpcProxyMetrics`).
pub struct Pending {
    pub count: u64,
    pub total_ms: f64,
    pub buckets: Vec<u64>,
}

impl Pending {
    pub fn new(bounds: &[f64]) -> Pending {
        Pending {
            count: 0,
            total_ms: 0.0,
            buckets: vec![0; bounds.len() + 1],
        }
    }

    pub fn add(&mut self, bounds: &[f64], latency_ms: f64) {
        self.count += 1;
        self.total_ms += latency_ms;
        self.buckets[bounds.partition_point(|&b| b < latency_ms)] += 1;
    }
}

/// An access line's request id: one we generated (32 hex digits) or the client's, held as
/// compactly as it came (no `String` for a generated one).
pub enum Rid {
    Generated([u8; 32]),
    Given(Box<str>),
}

impl Rid {
    pub fn as_str(&self) -> &str {
        match self {
            Rid::Generated(hex) => std::str::from_utf8(hex).unwrap_or(""),
            Rid::Given(text) => text,
        }
    }
}

/// A `take_records` answer: `rest` (the records and counters) with `access_bytes`, then the
/// access lines themselves (`access.rs`), that many bytes of text after the answer's line: no
/// JSON escaping of them here, no parsing there.
pub fn records_answer(mut rest: Value, access: &RefCell<AccessLines>) -> Reply {
    let (text, dropped) = access.borrow_mut().take();
    rest["access_bytes"] = json!(text.len());
    rest["access_dropped"] = json!(dropped);
    Reply::Blob(rest, text)
}

/// Seconds since the epoch, for access lines.
pub fn unix_time() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

// -- the control socket -----------------------------------------------------------------------

/// A private unix control socket (0600) at `path`, replacing a stale one.
pub fn bind_control(path: &str) -> io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Answer each connection of `listener` line by line: a JSON op in, `handle`'s JSON answer out.
pub fn serve_control<S: 'static>(
    listener: UnixListener,
    state: Rc<S>,
    handle: fn(&S, &Value) -> Reply,
) {
    tokio::task::spawn_local(async move {
        while let Ok((conn, _)) = listener.accept().await {
            tokio::task::spawn_local(control_connection(state.clone(), conn, handle));
        }
    });
}

/// A control op's answer: JSON, or JSON followed by the bytes its `access_bytes` counts
/// (`take_records` with its access lines).
pub enum Reply {
    Json(Value),
    Blob(Value, Vec<u8>),
}

async fn control_connection<S>(state: Rc<S>, conn: UnixStream, handle: fn(&S, &Value) -> Reply) {
    let (read, mut write) = conn.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let answer = match serde_json::from_str::<Value>(&line) {
            Ok(msg) => handle(&state, &msg),
            Err(e) => Reply::Json(json!({"ok": false, "error": format!("not JSON: {e}")})),
        };
        let (value, blob) = match answer {
            Reply::Json(value) => (value, Vec::new()),
            Reply::Blob(value, blob) => (value, blob),
        };
        let mut out = value.to_string();
        out.push('\n');
        if write.write_all(out.as_bytes()).await.is_err() {
            return;
        }
        if !blob.is_empty() && write.write_all(&blob).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_access_format_of_a_state_op_and_a_bad_one_refused_with_its_field() {
        let mut a = AccessLines::default();
        let format = json!({"json": false, "component": " p n "});
        a.apply(&json!({"access_log": true, "access_format": format}))
            .unwrap();
        assert!(a.on());
        a.apply(&json!({"access_log": false})).unwrap();
        assert!(!a.on());
        let err = a.apply(&json!({"access_log": true})).unwrap_err();
        assert!(err.starts_with("access_format:"), "{err}");
        let err = a
            .apply(&json!({"access_log": true, "access_format": {"json": 1, "component": ""}}))
            .unwrap_err();
        assert!(err.starts_with("access_format.json:"), "{err}");
    }

    fn snapshot(replicas: &[(&str, u16)]) -> Value {
        let eps: Vec<Value> = replicas
            .iter()
            .map(|(id, port)| json!({"replica_id": id, "host": "127.0.0.1", "port": port}))
            .collect();
        json!({
            "routes": [{"route_prefix": "/a", "app": "a", "deployment": "D"},
                       {"route_prefix": "/b", "app": "a", "deployment": "D"}],
            "deployments": {"a#D": {"max_ongoing_requests": 2, "replicas": eps}},
        })
    }

    #[test]
    fn install_shares_a_deployment_and_keeps_known_replicas() {
        let registry = Registry::default();
        let first = registry
            .install(&snapshot(&[("r1", 1), ("r2", 2)]))
            .unwrap();
        assert_eq!(first.routes.len(), 2);
        assert_eq!(first.deployments.len(), 1);
        let slot = pick(&first.deployments[0]).unwrap();
        let second = registry
            .install(&snapshot(&[("r1", 1), ("r3", 3)]))
            .unwrap();
        let r1 = &second.deployments[0].replicas[0];
        assert_eq!(r1.id, "r1");
        if slot.0.id == "r1" {
            assert_eq!(
                r1.ongoing.get(),
                1,
                "the same replica object, its count kept"
            );
        }
        drop(slot);
        assert_eq!(r1.ongoing.get(), 0);
    }

    #[test]
    fn pick_counts_both_processes_against_the_cap() {
        let registry = Registry::default();
        let routes = registry.install(&snapshot(&[("r1", 1)])).unwrap();
        let dep = &routes.deployments[0];
        registry
            .apply_load(&json!({"in_flight": {"r1": 1}}))
            .unwrap();
        let held = pick(dep).unwrap();
        assert!(
            pick(dep).is_none(),
            "1 theirs + 1 ours = max_ongoing_requests"
        );
        let ours = registry.apply_load(&json!({"in_flight": {}})).unwrap();
        assert_eq!(ours.get("r1"), Some(&json!(1)));
        drop(held);
    }

    #[test]
    fn request_ids_are_hex() {
        let id = request_id();
        assert!(id.iter().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(id, request_id());
    }
}
