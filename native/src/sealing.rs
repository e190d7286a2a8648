//! Sealed frames of kubeserve's internal channel, byte-compatible with
//! `kubeserve/runtime/sealing.py`: length (4, BE) | payload | tag (16), tag = MAC(seq (8, BE) |
//! length (4, BE) | payload), keyed BLAKE2b-128 up to 1 KiB, HMAC-SHA256 truncated to 16 bytes
//! above, each under its own subkey of the direction key.
//!
//! No I/O here: the proxy (`channel.rs`) and the replica's Python extension (`native/pyext`,
//! which includes this file as a module) share it.

use std::io;

use blake2::digest::{consts::U32, Mac};
use blake2::{Blake2b, Digest};
use hmac::Hmac;
use sha2::Sha256;

pub const TAG_SIZE: usize = 16;
pub const SMALL_FRAME: usize = 1024;
pub const MAX_FRAME: usize = 256 * 1024;

pub type HmacSha256 = Hmac<Sha256>;

/// Constant-time comparison.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The 16-byte tag of one frame under one direction key (`sealing._Tagger`).
pub struct Tagger {
    /// keyed BLAKE2b-128 (`blake2b_simd`: AVX2 when the CPU has it, chosen at run time)
    small: blake2b_simd::State,
    large: HmacSha256,
}

impl Tagger {
    pub fn new(key: &[u8]) -> Tagger {
        let sub = |label: &[u8]| -> [u8; 32] {
            let mut h = Blake2b::<U32>::new();
            Digest::update(&mut h, key);
            Digest::update(&mut h, label);
            h.finalize().into()
        };
        let small = sub(b"|small");
        let large = sub(b"|large");
        Tagger {
            small: blake2b_simd::Params::new()
                .hash_length(TAG_SIZE)
                .key(&small)
                .to_state(),
            large: <HmacSha256 as Mac>::new_from_slice(&large).expect("hmac takes any key"),
        }
    }

    pub fn tag(&self, prefix: &[u8; 12], payload: &[u8]) -> [u8; TAG_SIZE] {
        self.tag_parts(prefix, &[payload])
    }

    /// The tag of a payload given in pieces (their concatenation).
    pub fn tag_parts(&self, prefix: &[u8; 12], parts: &[&[u8]]) -> [u8; TAG_SIZE] {
        let mut out = [0u8; TAG_SIZE];
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len <= SMALL_FRAME {
            let mut state = self.small.clone();
            state.update(prefix);
            for part in parts {
                state.update(part);
            }
            out.copy_from_slice(state.finalize().as_bytes());
        } else {
            let mut mac = self.large.clone();
            mac.update(prefix);
            for part in parts {
                mac.update(part);
            }
            out.copy_from_slice(&mac.finalize().into_bytes()[..TAG_SIZE]);
        }
        out
    }
}

fn prefix(seq: u64, len: usize) -> [u8; 12] {
    let mut p = [0u8; 12];
    p[..8].copy_from_slice(&seq.to_be_bytes());
    p[8..].copy_from_slice(&(len as u32).to_be_bytes());
    p
}

/// The sending half of one direction.
pub struct Sealer {
    tagger: Tagger,
    seq: u64,
}

impl Sealer {
    pub fn new(key: &[u8]) -> Sealer {
        Sealer {
            tagger: Tagger::new(key),
            seq: 0,
        }
    }

    /// Append the frames of `payload` (split at MAX_FRAME) to `out`.
    pub fn seal_into(&mut self, payload: &[u8], out: &mut Vec<u8>) {
        for piece in payload.chunks(MAX_FRAME) {
            let p = prefix(self.seq, piece.len());
            self.seq += 1;
            out.extend_from_slice(&p[8..]);
            out.extend_from_slice(piece);
            out.extend_from_slice(&self.tagger.tag(&p, piece));
        }
    }

    /// `seal_into` of the concatenation of `parts`, without joining them first when they fit
    /// in one frame (the same frames either way).
    pub fn seal_parts_into(&mut self, parts: &[&[u8]], out: &mut Vec<u8>) {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > MAX_FRAME {
            return self.seal_into(&parts.concat(), out);
        }
        if len == 0 {
            return;
        }
        let p = prefix(self.seq, len);
        self.seq += 1;
        out.reserve(4 + len + TAG_SIZE);
        out.extend_from_slice(&p[8..]);
        for part in parts {
            out.extend_from_slice(part);
        }
        out.extend_from_slice(&self.tagger.tag_parts(&p, parts));
    }
}

/// The receiving half of one direction: verified payloads out of raw bytes.
pub struct Opener {
    tagger: Tagger,
    seq: u64,
    /// the bytes of a frame not complete yet
    raw: Vec<u8>,
}

/// Verify the complete frames at the start of `data`, append their payloads to `plain`; how
/// many bytes they took.
fn open_frames(
    tagger: &Tagger,
    seq: &mut u64,
    data: &[u8],
    plain: &mut Vec<u8>,
) -> io::Result<usize> {
    let mut start = 0;
    while data.len() - start >= 4 {
        let len = u32::from_be_bytes(data[start..start + 4].try_into().unwrap()) as usize;
        if len > MAX_FRAME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a frame of {len} bytes (the limit is {MAX_FRAME})"),
            ));
        }
        let end = start + 4 + len + TAG_SIZE;
        if end > data.len() {
            break;
        }
        let payload = &data[start + 4..start + 4 + len];
        let tag = tagger.tag(&prefix(*seq, len), payload);
        if !same(&tag, &data[start + 4 + len..end]) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a frame failed its MAC (altered, replayed or injected bytes)",
            ));
        }
        *seq += 1;
        plain.extend_from_slice(payload);
        start = end;
    }
    Ok(start)
}

impl Opener {
    pub fn new(key: &[u8]) -> Opener {
        Opener {
            tagger: Tagger::new(key),
            seq: 0,
            raw: Vec::new(),
        }
    }

    /// Before the connection idles in a pool: the buffer a large frame split across reads left
    /// is let go (it is empty between answers).
    pub fn trim(&mut self) {
        if self.raw.capacity() > 64 * 1024 && self.raw.is_empty() {
            self.raw = Vec::new();
        }
    }

    /// Append `data` and move every complete, verified payload into `plain`.
    pub fn feed(&mut self, data: &[u8], plain: &mut Vec<u8>) -> io::Result<()> {
        if self.raw.is_empty() {
            // the usual case, whole frames in one read: verified where they were read
            let used = open_frames(&self.tagger, &mut self.seq, data, plain)?;
            self.raw.extend_from_slice(&data[used..]);
            return Ok(());
        }
        self.raw.extend_from_slice(data);
        let used = open_frames(&self.tagger, &mut self.seq, &self.raw, plain)?;
        self.raw.drain(..used);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blake2::digest::consts::U16;
    use blake2::Blake2bMac;

    /// The tags as `sealing._Tagger` computes them: keyed BLAKE2b-128 up to 1 KiB, HMAC-SHA256
    /// truncated above, whole or in pieces.
    #[test]
    fn tags_match_the_reference_macs() {
        let key = [7u8; 32];
        let t = Tagger::new(&key);
        let sub = |label: &[u8]| -> [u8; 32] {
            let mut h = Blake2b::<U32>::new();
            Digest::update(&mut h, key);
            Digest::update(&mut h, label);
            h.finalize().into()
        };
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 31 % 251) as u8).collect();
        for len in [
            0, 1, 115, 116, 117, 128, 243, 244, 245, 500, 1024, 1025, 3000,
        ] {
            let payload = &data[..len];
            let p = prefix(9, len);
            let want: [u8; 16] = if len <= SMALL_FRAME {
                let mut mac = Blake2bMac::<U16>::new_from_slice(&sub(b"|small")).unwrap();
                Mac::update(&mut mac, &p);
                Mac::update(&mut mac, payload);
                mac.finalize().into_bytes().into()
            } else {
                let mut mac = <HmacSha256 as Mac>::new_from_slice(&sub(b"|large")).unwrap();
                mac.update(&p);
                mac.update(payload);
                mac.finalize().into_bytes()[..16].try_into().unwrap()
            };
            assert_eq!(t.tag(&p, payload), want, "{len}");
            let cut = len / 3;
            assert_eq!(
                t.tag_parts(&p, &[&payload[..cut], &[], &payload[cut..]]),
                want,
                "{len}"
            );
        }
    }

    #[test]
    fn sealed_parts_open_as_one_payload_across_splits() {
        let key = [3u8; 32];
        let mut sealer = Sealer::new(&key);
        let mut wire = Vec::new();
        sealer.seal_parts_into(&[b"GET / HTTP/1.1\r\n", b"", b"x: y\r\n\r\n"], &mut wire);
        sealer.seal_into(b"second", &mut wire);
        let mut joined = Vec::new();
        Sealer::new(&key).seal_into(b"GET / HTTP/1.1\r\nx: y\r\n\r\n", &mut joined);
        assert_eq!(&wire[..joined.len()], &joined[..]);
        for split in 0..wire.len() {
            let mut opener = Opener::new(&key);
            let mut plain = Vec::new();
            opener.feed(&wire[..split], &mut plain).unwrap();
            opener.feed(&wire[split..], &mut plain).unwrap();
            assert_eq!(&plain[..], b"GET / HTTP/1.1\r\nx: y\r\n\r\nsecond");
        }
        let mut bad = wire.clone();
        bad[10] ^= 1;
        assert!(Opener::new(&key).feed(&bad, &mut Vec::new()).is_err());
    }
}
