//! The caller's side of kubeserve's internal channel, byte-compatible with
//! `kubeserve/runtime/channel.py` (handshake) and `kubeserve/runtime/sealing.py` (sealed frames).
//!
//! Handshake (caller = us, INGRESS role):
//!   caller  -> replica  MAGIC "KSC2" | role | caller nonce (16) | id length (1) | replica id
//!   replica -> caller   replica nonce (16) | HMAC-SHA256(secret, "server" | transcript)
//!   caller  -> replica  HMAC-SHA256(secret, "client" | transcript), then sealed frames
//! Frames: length (4, BE) | payload | tag (16), tag = MAC(seq (8, BE) | length (4, BE) | payload),
//! keyed BLAKE2b-128 up to 1 KiB, HMAC-SHA256 truncated to 16 bytes above.

use std::io;

use hmac::Mac;

use crate::sealing::{same, HmacSha256};
pub use crate::sealing::{Opener, Sealer};
use std::io::{Read, Write};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

pub const MAGIC: &[u8] = b"KSC2";
pub const ROLE_INGRESS: u8 = b'i';
/// Handle calls (`/-/call/<method>`): the native gRPC front's connections (`grpc.rs`).
pub const ROLE_CONTROL: u8 = b'c';

fn hmac256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = <HmacSha256 as Mac>::new_from_slice(key).expect("hmac takes any key");
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

/// A byte stream to a replica: its same-host unix socket or TCP.
pub enum Stream {
    Tcp(TcpStream),
    Unix(LocalStream),
}

impl Stream {
    pub async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf).await,
            Stream::Unix(s) => s.read(buf).await,
        }
    }

    /// Whether the replica closed this idle connection (or sent something unasked): a pooled
    /// connection is only reused while this is false.
    pub fn closed_while_idle(&self) -> bool {
        let mut probe = [0u8; 1];
        let result = match self {
            Stream::Tcp(s) => s.try_read(&mut probe),
            Stream::Unix(s) => s.try_read(&mut probe),
        };
        !matches!(result, Err(ref e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    pub async fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.write_all(buf).await,
            Stream::Unix(s) => s.write_all(buf).await,
        }
    }
}

/// A replica's unix socket, registered with the event loop for reading only. A unix socket
/// signals "writable" each time its peer consumes what was sent (the replica reading each
/// request): registered for writing too, every request would wake this process once more for
/// nothing. Writes go straight to the (non-blocking) socket; only when it is full does a
/// duplicate of it, registered for writing, wait for room.
pub struct LocalStream {
    fd: AsyncFd<std::os::unix::net::UnixStream>,
}

impl LocalStream {
    fn new(sock: std::os::unix::net::UnixStream) -> io::Result<LocalStream> {
        sock.set_nonblocking(true)?;
        Ok(LocalStream {
            // SAFETY: the std socket owns its descriptor and is never swapped for another
            fd: unsafe { AsyncFd::register_with_interest(sock, Interest::READABLE)? },
        })
    }

    async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|s| s.get_ref().read(buf)) {
                Ok(Ok(n)) => {
                    if n > 0 && n < buf.len() {
                        // all there was (as tokio's own sockets): the next read waits for an
                        // event instead of trying first
                        guard.clear_ready();
                    }
                    return Ok(n);
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }

    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match self.fd.poll_read_ready(&mut cx) {
            std::task::Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
            std::task::Poll::Ready(Err(e)) => Err(e),
            std::task::Poll::Ready(Ok(mut guard)) => {
                match guard.try_io(|s| s.get_ref().read(buf)) {
                    Ok(result) => result,
                    Err(_would_block) => Err(io::ErrorKind::WouldBlock.into()),
                }
            }
        }
    }

    async fn write_all(&self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            match self.fd.get_ref().write(buf) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => buf = &buf[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let dup = self.fd.get_ref().try_clone()?;
                    // SAFETY: as in `new`, for the duplicate
                    let room = unsafe { AsyncFd::register_with_interest(dup, Interest::WRITABLE)? };
                    let _ = room.writable().await?;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

fn is_loopback(host: &str) -> bool {
    matches!(host, "127.0.0.1" | "localhost" | "::1")
}

fn my_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

/// The directory of the node's replica sockets in a pod (`KUBESERVE_NODE_SOCKETS`, set with
/// `ServeInstance.spec.proxy.nodeLocalSockets`), read once.
fn node_sockets() -> Option<&'static str> {
    static DIR: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    DIR.get_or_init(|| std::env::var("KUBESERVE_NODE_SOCKETS").ok().filter(|d| !d.is_empty()))
        .as_deref()
}

/// The replica's unix socket (`local_socket.connect_socket`), when it listens there under our
/// own uid: its abstract name for a loopback host, else its file in the node's directory of
/// replica sockets (a replica on this node; none, or a stale file: TCP).
fn connect_local(host: &str, port: u16) -> Option<LocalStream> {
    use std::os::linux::net::SocketAddrExt;
    let sock = if is_loopback(host) {
        let name = format!("kubeserve-replica-{port}");
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).ok()?;
        std::os::unix::net::UnixStream::connect_addr(&addr).ok()?
    } else {
        let dir = node_sockets()?;
        std::os::unix::net::UnixStream::connect(format!("{dir}/{host}-{port}.sock")).ok()?
    };
    sock.set_nonblocking(true).ok()?;
    let sock = UnixStream::from_std(sock).ok()?;
    let cred = sock.peer_cred().ok()?;
    if Some(cred.uid()) != my_uid() {
        return None;
    }
    LocalStream::new(sock.into_std().ok()?).ok()
}

/// An open, authenticated connection to one replica.
pub struct Channel {
    pub stream: Stream,
    pub sealer: Sealer,
    pub opener: Opener,
}

pub fn nonce() -> [u8; 16] {
    let mut n = [0u8; 16];
    getrandom::getrandom(&mut n).expect("the OS random source");
    n
}

/// Connect to replica `identity` on `host:port` and pass the handshake.
pub async fn connect(secret: &[u8], host: &str, port: u16, identity: &str) -> io::Result<Channel> {
    connect_as(secret, host, port, identity, ROLE_INGRESS).await
}

/// `connect` in another role.
pub async fn connect_as(
    secret: &[u8],
    host: &str,
    port: u16,
    identity: &str,
    role: u8,
) -> io::Result<Channel> {
    let mut stream = match connect_local(host, port) {
        Some(s) => Stream::Unix(s),
        None => {
            let s = TcpStream::connect((host, port)).await?;
            s.set_nodelay(true)?;
            Stream::Tcp(s)
        }
    };
    let meant = identity.as_bytes();
    if meant.is_empty() || meant.len() > 255 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "bad replica id",
        ));
    }
    let caller = nonce();
    let mut hello = Vec::with_capacity(22 + meant.len());
    hello.extend_from_slice(MAGIC);
    hello.push(role);
    hello.extend_from_slice(&caller);
    hello.push(meant.len() as u8);
    hello.extend_from_slice(meant);
    stream.write_all(&hello).await?;
    let mut challenge = [0u8; 48];
    let mut got = 0;
    while got < challenge.len() {
        let n = stream.read(&mut challenge[got..]).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("the peer closed the connection during the handshake (is it replica {identity}?)"),
            ));
        }
        got += n;
    }
    let mut transcript = Vec::with_capacity(34 + meant.len());
    transcript.push(role);
    transcript.extend_from_slice(&caller);
    transcript.extend_from_slice(&challenge[..16]);
    transcript.push(meant.len() as u8);
    transcript.extend_from_slice(meant);
    if !same(
        &challenge[16..],
        &hmac256(secret, &[b"server", &transcript]),
    ) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("the peer is not replica {identity} of this instance (wrong handshake proof)"),
        ));
    }
    stream
        .write_all(&hmac256(secret, &[b"client", &transcript]))
        .await?;
    let send = hmac256(secret, &[b"key:caller", &transcript]);
    let receive = hmac256(secret, &[b"key:replica", &transcript]);
    Ok(Channel {
        stream,
        sealer: Sealer::new(&send),
        opener: Opener::new(&receive),
    })
}

/// The instance's data-plane secret, as `channel.take_secret` reads it.
pub fn take_secret() -> Result<Vec<u8>, String> {
    let value = std::env::var("KUBESERVE_DATA_PLANE_SECRET").ok();
    let path = std::env::var("KUBESERVE_DATA_PLANE_SECRET_FILE").ok();
    std::env::remove_var("KUBESERVE_DATA_PLANE_SECRET");
    std::env::remove_var("KUBESERVE_DATA_PLANE_SECRET_FILE");
    let text = match (value, path) {
        (Some(v), _) => v,
        (None, Some(p)) if !p.is_empty() => std::fs::read_to_string(&p)
            .map_err(|e| format!("cannot read the data-plane secret {p}: {e}"))?,
        _ => return Err("no data-plane secret: set KUBESERVE_DATA_PLANE_SECRET or KUBESERVE_DATA_PLANE_SECRET_FILE".into()),
    };
    let secret = text.trim().as_bytes().to_vec();
    if secret.len() < 16 {
        return Err("the data-plane secret is shorter than 16 bytes".into());
    }
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write larger than the socket's buffer waits for room (the read-only registration's
    /// slow path), reads see every byte, an idle socket reads as open until its peer closes.
    #[test]
    fn a_local_stream_writes_past_a_full_buffer_and_reads_what_comes() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build_local(tokio::runtime::LocalOptions::default())
            .unwrap();
        rt.block_on(async {
            let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
            let s = Stream::Unix(LocalStream::new(ours).unwrap());
            let big: Vec<u8> = (0..4_000_000u32).map(|i| (i % 253) as u8).collect();
            let expected = big.clone();
            let peer = std::thread::spawn(move || {
                let mut theirs = theirs;
                let mut got = vec![0u8; expected.len()];
                std::thread::sleep(std::time::Duration::from_millis(50));
                theirs.read_exact(&mut got).unwrap();
                assert!(got == expected);
                theirs.write_all(b"answer").unwrap();
                std::thread::sleep(std::time::Duration::from_millis(50));
                drop(theirs);
            });
            let mut s = s;
            assert!(!s.closed_while_idle());
            s.write_all(&big).await.unwrap();
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf).await.unwrap();
            assert_eq!(&buf[..n], b"answer");
            assert_eq!(s.read(&mut buf).await.unwrap(), 0);
            peer.join().unwrap();
            assert!(s.closed_while_idle());
        });
    }
}
