//! `kubeserve-fastpath`: kubeserve's native data path, the proxies' default (see README).
//!
//! `serve`: a client-facing HTTP/1.1 keep-alive fast path in front of the Python proxy. Requests
//! it covers (HTTP/1.1, `Content-Length` or no body up to `max_body_bytes`, no hop-by-hop or
//! upgrade headers, a path in its normal form matching a route, a replica below its
//! `max_ongoing_requests`, chosen by power of two choices on both processes' requests in flight)
//! are forwarded over pooled sealed INGRESS channel connections
//! (`channel.rs`) and the answers (Content-Length, chunked or until close) relayed verbatim.
//! While it waits for an answer it watches the client: a client that leaves before the answer's
//! end has the replica connection closed (the replica cancels the request, as Ray does), 499.
//! Everything else, from the first byte it does not cover on, is handed to the Python proxy: the
//! connection is spliced to it, with the bytes already read, so behaviour never differs.
//! State (the discovery snapshot, settings such as `max_connections`) is pushed over a private
//! unix control socket, counters pulled back over it; the Python proxy's requests in flight
//! are exchanged for ours (`load`) and a leaving proxy drains us (`drain`) over it too. With
//! `--tls` it serves HTTPS (`tls.rs`): the certificate pair comes over the control socket too
//! (and again at each rotation), and hand-offs carry the decrypted bytes.
//!
//! `probe`: one request over a fresh sealed connection, the answer on stdout (tests, debugging).

mod access;
mod channel;
mod frames;
mod grpc;
mod http;
mod memory;
mod routing;
mod sealing;
mod serve;
mod tls;

use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!(
        "usage: kubeserve-fastpath serve --listen HOST:PORT|fd:N --control PATH --fallback unix:PATH|HOST:PORT [--tls]\n\
         \x20        [--grpc-listen HOST:PORT --grpc-control PATH --grpc-fallback unix:PATH|HOST:PORT]\n\
         \x20      kubeserve-fastpath probe HOST PORT REPLICA_ID METHOD PATH [BODY]\n\
         the data-plane secret comes from KUBESERVE_DATA_PLANE_SECRET(_FILE)"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let secret = match channel::take_secret() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("kubeserve-fastpath: {e}");
            return ExitCode::from(2);
        }
    };
    // One thread, tasks that need not be Send (`spawn_local`) scheduled by the runtime itself:
    // a task woken by an I/O event is queued in place, without the eventfd write and extra
    // epoll_wait a LocalSet's wake-up of the runtime costs.
    memory::setup();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build_local(tokio::runtime::LocalOptions::default())
        .expect("runtime");
    match args.first().map(String::as_str) {
        Some("probe") if args.len() >= 6 => {
            let port: u16 = match args[2].parse() {
                Ok(p) => p,
                Err(_) => return usage(),
            };
            let body = args.get(6).cloned().unwrap_or_default();
            match rt.block_on(probe(
                &secret, &args[1], port, &args[3], &args[4], &args[5], body,
            )) {
                Ok(out) => {
                    use std::io::Write;
                    let _ = std::io::stdout().write_all(&out);
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("kubeserve-fastpath: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Some("serve") => {
            let mut listen = None;
            let mut control = None;
            let mut fallback = None;
            let mut tls = false;
            let (mut grpc_listen, mut grpc_control, mut grpc_fallback) = (None, None, None);
            let mut it = args[1..].iter();
            while let Some(flag) = it.next() {
                if flag == "--tls" {
                    tls = true;
                    continue;
                }
                let value = it.next().cloned();
                match flag.as_str() {
                    "--listen" => listen = value,
                    "--control" => control = value,
                    "--fallback" => fallback = value,
                    "--grpc-listen" => grpc_listen = value,
                    "--grpc-control" => grpc_control = value,
                    "--grpc-fallback" => grpc_fallback = value,
                    _ => return usage(),
                }
            }
            let (Some(listen), Some(control), Some(fallback)) = (listen, control, fallback) else {
                return usage();
            };
            // The process that started us holds our stdin's other end: when it ends (even killed),
            // so do we, and the listening socket is not left to an orphan.
            std::thread::spawn(|| {
                let mut sink = [0u8; 64];
                let mut stdin = std::io::stdin();
                while matches!(std::io::Read::read(&mut stdin, &mut sink), Ok(n) if n > 0) {}
                std::process::exit(0);
            });
            // the replicas, one registry for both fronts (`routing.rs`)
            let registry = std::rc::Rc::new(routing::Registry::default());
            // freed memory back to the system once load ends (`memory.rs`)
            rt.spawn_local(async { memory::spawn_trimmer() });
            // the gRPC front (`grpc.rs`): a listener and control socket of its own
            match (grpc_listen, grpc_control, grpc_fallback) {
                (Some(l), Some(c), Some(f)) => {
                    let secret = secret.clone();
                    let registry = registry.clone();
                    rt.spawn_local(async move {
                        if let Err(e) = grpc::run(secret, l, c, f, registry).await {
                            eprintln!("kubeserve-fastpath: grpc: {e}");
                            std::process::exit(1);
                        }
                    });
                }
                (None, None, None) => {}
                _ => return usage(),
            }
            match rt.block_on(serve::run(secret, listen, control, fallback, tls, registry)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("kubeserve-fastpath: {e}");
                    ExitCode::from(1)
                }
            }
        }
        _ => usage(),
    }
}

async fn probe(
    secret: &[u8],
    host: &str,
    port: u16,
    identity: &str,
    method: &str,
    path: &str,
    body: String,
) -> std::io::Result<Vec<u8>> {
    let mut ch = channel::connect(secret, host, port, identity).await?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut sealed = Vec::new();
    ch.sealer.seal_into(request.as_bytes(), &mut sealed);
    ch.stream.write_all(&sealed).await?;
    let mut plain = Vec::new();
    let mut buf = vec![0u8; 65536];
    loop {
        let n = ch.stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(plain);
        }
        ch.opener.feed(&buf[..n], &mut plain)?;
    }
}
