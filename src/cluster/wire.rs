//! The cluster bus's binary messages, byte for byte as Redis 7 lays out `clusterMsg`:
//! a 2256-byte header (integers in network byte order), then a body that depends on
//! the type, then, for PING/PONG/MEET, the optional extensions. Encoding and decoding
//! only; what a message means is `bus.rs`'s business.

use super::state::Name;
use super::SLOTS;

pub const SIG: &[u8; 4] = b"RCmb";
pub const VERSION: u16 = 1;
/// The header's size: every message is at least this long.
pub const HEADER: usize = 2256;
pub const GOSSIP: usize = 104;
const IP_LEN: usize = 46;
/// Longer messages are refused (the link is closed): nothing legitimate comes near it.
pub const MAX_LEN: usize = 64 << 20;

pub const PING: u16 = 0;
pub const PONG: u16 = 1;
pub const MEET: u16 = 2;
pub const FAIL: u16 = 3;
pub const PUBLISH: u16 = 4;
pub const AUTH_REQUEST: u16 = 5;
pub const AUTH_ACK: u16 = 6;
pub const UPDATE: u16 = 7;
pub const MFSTART: u16 = 8;
pub const PUBLISHSHARD: u16 = 10;

/// mflags[0]: the sender is a master paused for its replica's manual failover.
pub const FLAG0_PAUSED: u8 = 1;
/// mflags[0]: a manual failover asks masters to vote though the master is not failing.
pub const FLAG0_FORCEACK: u8 = 1 << 1;
/// mflags[0]: the sender understands ping extensions.
pub const FLAG0_EXT_DATA: u8 = 1 << 2;

pub const EXT_HOSTNAME: u16 = 0;
pub const EXT_HUMAN_NODENAME: u16 = 1;
pub const EXT_FORGOTTEN_NODE: u16 = 2;
pub const EXT_SHARDID: u16 = 3;

/// The sender's side of every message.
#[derive(Clone)]
pub struct Header {
    pub typ: u16,
    pub count: u16,
    pub port: u16,
    pub current_epoch: u64,
    pub config_epoch: u64,
    pub offset: u64,
    pub sender: Name,
    pub slots: Box<[u8; SLOTS / 8]>,
    /// All zeroes: none.
    pub slaveof: Name,
    pub myip: String,
    pub extensions: u16,
    pub pport: u16,
    pub cport: u16,
    pub flags: u16,
    /// 0: ok, 1: fail.
    pub state: u8,
    pub mflags: [u8; 3],
}

#[derive(Clone, Debug)]
pub struct Gossip {
    pub name: Name,
    pub ping_sent: u32,
    pub pong_received: u32,
    pub ip: String,
    pub port: u16,
    pub cport: u16,
    pub flags: u16,
    pub pport: u16,
}

pub enum Body {
    Gossip(Vec<Gossip>),
    Fail(Name),
    Update {
        config_epoch: u64,
        name: Name,
        slots: Box<[u8; SLOTS / 8]>,
    },
    Publish {
        channel: Vec<u8>,
        message: Vec<u8>,
    },
    /// Types Kite does not act on (failover votes, module messages...).
    Other,
}

#[derive(Default)]
pub struct Extensions {
    pub hostname: Option<String>,
    pub human_name: Option<String>,
    pub shard_id: Option<Name>,
    pub forgotten: Vec<(Name, u64)>,
}

pub struct Message {
    pub header: Header,
    pub body: Body,
    pub ext: Extensions,
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn name_at(b: &[u8], at: usize) -> Name {
    b[at..at + 40].try_into().expect("40 bytes")
}
fn c_string(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}
fn put_ip(out: &mut Vec<u8>, ip: &str) {
    let mut field = [0u8; IP_LEN];
    let n = ip.len().min(IP_LEN - 1);
    field[..n].copy_from_slice(&ip.as_bytes()[..n]);
    out.extend_from_slice(&field);
}

/// The total length a frame announces in its first 8 bytes, once its signature is
/// checked; None for a stream that is not the cluster bus.
pub fn frame_len(first8: &[u8; 8]) -> Option<usize> {
    if &first8[..4] != SIG {
        return None;
    }
    let len = u32::from_be_bytes(first8[4..8].try_into().expect("4 bytes")) as usize;
    (HEADER..=MAX_LEN).contains(&len).then_some(len)
}

impl Header {
    fn encode(&self, out: &mut Vec<u8>, totlen: usize) {
        out.extend_from_slice(SIG);
        out.extend_from_slice(&(totlen as u32).to_be_bytes());
        out.extend_from_slice(&VERSION.to_be_bytes());
        out.extend_from_slice(&self.port.to_be_bytes());
        out.extend_from_slice(&self.typ.to_be_bytes());
        out.extend_from_slice(&self.count.to_be_bytes());
        out.extend_from_slice(&self.current_epoch.to_be_bytes());
        out.extend_from_slice(&self.config_epoch.to_be_bytes());
        out.extend_from_slice(&self.offset.to_be_bytes());
        out.extend_from_slice(&self.sender);
        out.extend_from_slice(&self.slots[..]);
        out.extend_from_slice(&self.slaveof);
        put_ip(out, &self.myip);
        out.extend_from_slice(&self.extensions.to_be_bytes());
        out.extend_from_slice(&[0u8; 30]);
        out.extend_from_slice(&self.pport.to_be_bytes());
        out.extend_from_slice(&self.cport.to_be_bytes());
        out.extend_from_slice(&self.flags.to_be_bytes());
        out.push(self.state);
        out.extend_from_slice(&self.mflags);
    }

    fn decode(b: &[u8]) -> Header {
        Header {
            port: be16(b, 10),
            typ: be16(b, 12),
            count: be16(b, 14),
            current_epoch: be64(b, 16),
            config_epoch: be64(b, 24),
            offset: be64(b, 32),
            sender: name_at(b, 40),
            slots: Box::new(b[80..80 + SLOTS / 8].try_into().expect("bitmap")),
            slaveof: name_at(b, 2128),
            myip: c_string(&b[2168..2168 + IP_LEN]),
            extensions: be16(b, 2214),
            pport: be16(b, 2246),
            cport: be16(b, 2248),
            flags: be16(b, 2250),
            state: b[2252],
            mflags: [b[2253], b[2254], b[2255]],
        }
    }
}

/// PING, PONG or MEET with its gossip and extensions.
pub fn encode_ping(h: &Header, gossip: &[Gossip], ext: &Extensions) -> Vec<u8> {
    let mut exts: Vec<u8> = Vec::new();
    let mut n_ext = 0u16;
    let mut push_ext = |typ: u16, data: &[u8]| {
        // Each extension is 8-byte aligned: its data padded with zeroes.
        let padded = (8 + data.len()).div_ceil(8) * 8;
        exts.extend_from_slice(&(padded as u32).to_be_bytes());
        exts.extend_from_slice(&typ.to_be_bytes());
        exts.extend_from_slice(&[0, 0]);
        exts.extend_from_slice(data);
        exts.resize(exts.len() + padded - 8 - data.len(), 0);
        n_ext += 1;
    };
    if let Some(h) = &ext.hostname {
        let mut d = h.as_bytes().to_vec();
        d.push(0);
        push_ext(EXT_HOSTNAME, &d);
    }
    if let Some(h) = &ext.human_name {
        let mut d = h.as_bytes().to_vec();
        d.push(0);
        push_ext(EXT_HUMAN_NODENAME, &d);
    }
    for (name, ttl) in &ext.forgotten {
        let mut d = name.to_vec();
        d.extend_from_slice(&ttl.to_be_bytes());
        push_ext(EXT_FORGOTTEN_NODE, &d);
    }
    if let Some(id) = &ext.shard_id {
        push_ext(EXT_SHARDID, id);
    }
    let mut h = h.clone();
    h.count = gossip.len() as u16;
    h.extensions = n_ext;
    if n_ext > 0 {
        h.mflags[0] |= FLAG0_EXT_DATA;
    }
    let total = HEADER + gossip.len() * GOSSIP + exts.len();
    let mut out = Vec::with_capacity(total);
    h.encode(&mut out, total);
    for g in gossip {
        out.extend_from_slice(&g.name);
        out.extend_from_slice(&g.ping_sent.to_be_bytes());
        out.extend_from_slice(&g.pong_received.to_be_bytes());
        put_ip(&mut out, &g.ip);
        out.extend_from_slice(&g.port.to_be_bytes());
        out.extend_from_slice(&g.cport.to_be_bytes());
        out.extend_from_slice(&g.flags.to_be_bytes());
        out.extend_from_slice(&g.pport.to_be_bytes());
        out.extend_from_slice(&[0, 0]);
    }
    out.extend_from_slice(&exts);
    debug_assert_eq!(out.len(), total);
    out
}

/// A message that is its header alone (failover votes asked and given).
pub fn encode_bare(h: &Header, typ: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER);
    let mut h = h.clone();
    h.typ = typ;
    h.count = 0;
    h.extensions = 0;
    h.encode(&mut out, HEADER);
    out
}

pub fn encode_fail(h: &Header, about: &Name) -> Vec<u8> {
    let total = HEADER + 40;
    let mut out = Vec::with_capacity(total);
    let mut h = h.clone();
    h.typ = FAIL;
    h.count = 0;
    h.extensions = 0;
    h.encode(&mut out, total);
    out.extend_from_slice(about);
    out
}

pub fn encode_update(
    h: &Header,
    config_epoch: u64,
    name: &Name,
    slots: &[u8; SLOTS / 8],
) -> Vec<u8> {
    let total = HEADER + 8 + 40 + SLOTS / 8;
    let mut out = Vec::with_capacity(total);
    let mut h = h.clone();
    h.typ = UPDATE;
    h.count = 0;
    h.extensions = 0;
    h.encode(&mut out, total);
    out.extend_from_slice(&config_epoch.to_be_bytes());
    out.extend_from_slice(name);
    out.extend_from_slice(slots);
    out
}

pub fn encode_publish(h: &Header, typ: u16, channel: &[u8], message: &[u8]) -> Vec<u8> {
    // Redis's struct has an 8-byte placeholder for the data; the length leaves it out.
    let total = HEADER + 8 + channel.len() + message.len();
    let mut out = Vec::with_capacity(total);
    let mut h = h.clone();
    h.typ = typ;
    h.count = 0;
    h.extensions = 0;
    h.encode(&mut out, total);
    out.extend_from_slice(&(channel.len() as u32).to_be_bytes());
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(channel);
    out.extend_from_slice(message);
    out.resize(total, 0);
    out
}

/// Decodes one whole frame; Err says why it is dropped, as Redis logs it.
pub fn decode(b: &[u8]) -> Result<Message, String> {
    if b.len() < HEADER || &b[..4] != SIG {
        return Err("short or unsigned message".into());
    }
    let header = Header::decode(b);
    if be16(b, 8) != VERSION {
        return Err(format!("unsupported bus version {}", be16(b, 8)));
    }
    let body_at = HEADER;
    let mut ext = Extensions::default();
    let body = match header.typ {
        PING | PONG | MEET => {
            let count = header.count as usize;
            let mut at = body_at;
            if b.len() < at + count * GOSSIP {
                return Err("gossip section past the message's end".into());
            }
            let mut gossip = Vec::with_capacity(count);
            for _ in 0..count {
                gossip.push(Gossip {
                    name: name_at(b, at),
                    ping_sent: be32(b, at + 40),
                    pong_received: be32(b, at + 44),
                    ip: c_string(&b[at + 48..at + 48 + IP_LEN]),
                    port: be16(b, at + 94),
                    cport: be16(b, at + 96),
                    flags: be16(b, at + 98),
                    pport: be16(b, at + 100),
                });
                at += GOSSIP;
            }
            if header.mflags[0] & FLAG0_EXT_DATA != 0 {
                for _ in 0..header.extensions {
                    if b.len() < at + 8 {
                        return Err("extension header past the message's end".into());
                    }
                    let len = be32(b, at) as usize;
                    let typ = be16(b, at + 4);
                    if len < 8 || b.len() < at + len {
                        return Err("extension past the message's end".into());
                    }
                    let data = &b[at + 8..at + len];
                    match typ {
                        EXT_HOSTNAME => ext.hostname = Some(c_string(data)),
                        EXT_HUMAN_NODENAME => ext.human_name = Some(c_string(data)),
                        EXT_FORGOTTEN_NODE if data.len() >= 48 => {
                            ext.forgotten.push((name_at(data, 0), be64(data, 40)))
                        }
                        EXT_SHARDID if data.len() >= 40 => ext.shard_id = Some(name_at(data, 0)),
                        _ => {}
                    }
                    at += len;
                }
            }
            if at != b.len() {
                return Err(format!(
                    "invalid ping of length {} but expected length {at}",
                    b.len()
                ));
            }
            Body::Gossip(gossip)
        }
        FAIL => {
            if b.len() != body_at + 40 {
                return Err("invalid FAIL length".into());
            }
            Body::Fail(name_at(b, body_at))
        }
        UPDATE => {
            if b.len() != body_at + 8 + 40 + SLOTS / 8 {
                return Err("invalid UPDATE length".into());
            }
            Body::Update {
                config_epoch: be64(b, body_at),
                name: name_at(b, body_at + 8),
                slots: Box::new(
                    b[body_at + 48..body_at + 48 + SLOTS / 8]
                        .try_into()
                        .expect("bitmap"),
                ),
            }
        }
        PUBLISH | PUBLISHSHARD => {
            if b.len() < body_at + 8 {
                return Err("invalid PUBLISH length".into());
            }
            let cl = be32(b, body_at) as usize;
            let ml = be32(b, body_at + 4) as usize;
            let start = body_at + 8;
            if b.len() < start + cl + ml {
                return Err("invalid PUBLISH length".into());
            }
            Body::Publish {
                channel: b[start..start + cl].to_vec(),
                message: b[start + cl..start + cl + ml].to_vec(),
            }
        }
        AUTH_REQUEST | AUTH_ACK | MFSTART => {
            if b.len() != HEADER {
                return Err("invalid failover auth length".into());
            }
            Body::Other
        }
        _ => Body::Other,
    };
    Ok(Message { header, body, ext })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            typ: PING,
            count: 0,
            port: 7000,
            current_epoch: 5,
            config_epoch: 3,
            offset: 99,
            sender: [b'a'; 40],
            slots: Box::new([0; SLOTS / 8]),
            slaveof: [0; 40],
            myip: "127.0.0.1".into(),
            extensions: 0,
            pport: 0,
            cport: 17000,
            flags: 1,
            state: 0,
            mflags: [0; 3],
        }
    }

    #[test]
    fn ping_round_trip_with_gossip_and_extensions() {
        let mut h = header();
        h.slots[3] = 0x81;
        let g = Gossip {
            name: [b'b'; 40],
            ping_sent: 1,
            pong_received: 2,
            ip: "127.0.0.2".into(),
            port: 7001,
            cport: 17001,
            flags: 2,
            pport: 0,
        };
        let ext = Extensions {
            hostname: Some("host-1".into()),
            shard_id: Some([b'c'; 40]),
            ..Default::default()
        };
        let bytes = encode_ping(&h, &[g.clone(), g], &ext);
        assert_eq!(&bytes[..4], b"RCmb");
        assert_eq!(
            frame_len(&bytes[..8].try_into().unwrap()),
            Some(bytes.len())
        );
        // Every extension keeps the message 8-byte aligned after the gossip.
        assert_eq!((bytes.len() - HEADER - 2 * GOSSIP) % 8, 0);
        let m = decode(&bytes).unwrap();
        assert_eq!(m.header.port, 7000);
        assert_eq!(m.header.current_epoch, 5);
        assert_eq!(m.header.slots[3], 0x81);
        assert_eq!(m.header.myip, "127.0.0.1");
        assert_eq!(m.ext.hostname.as_deref(), Some("host-1"));
        assert_eq!(m.ext.shard_id, Some([b'c'; 40]));
        let Body::Gossip(g) = m.body else { panic!() };
        assert_eq!(g.len(), 2);
        assert_eq!(g[1].ip, "127.0.0.2");
        assert_eq!(g[1].cport, 17001);
    }

    #[test]
    fn field_offsets_match_redis() {
        let h = header();
        let b = encode_ping(&h, &[], &Extensions::default());
        assert_eq!(b.len(), HEADER);
        assert_eq!(&b[2168..2177], b"127.0.0.1");
        assert_eq!(u16::from_be_bytes([b[2248], b[2249]]), 17000);
        assert_eq!(u16::from_be_bytes([b[2250], b[2251]]), 1);
    }

    /// Whatever a peer sends, decoding answers Ok or Err and never panics: random headers
    /// with random counts, types, flags and extension fields, at random lengths.
    #[test]
    fn random_messages_never_panic() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rand = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..3000 {
            let len = HEADER + (rand() % 600) as usize;
            let mut b: Vec<u8> = (0..len).map(|_| rand() as u8).collect();
            b[..4].copy_from_slice(SIG);
            b[4..8].copy_from_slice(&(len as u32).to_be_bytes());
            b[8..10].copy_from_slice(&VERSION.to_be_bytes());
            // Types that have bodies, small gossip counts, extensions announced.
            b[12..14].copy_from_slice(&((rand() % 12) as u16).to_be_bytes());
            b[14..16].copy_from_slice(&((rand() % 8) as u16).to_be_bytes());
            b[2214..2216].copy_from_slice(&((rand() % 4) as u16).to_be_bytes());
            b[2253] |= FLAG0_EXT_DATA;
            let _ = decode(&b);
        }
    }

    #[test]
    fn bad_lengths_are_refused() {
        let h = header();
        let mut b = encode_ping(&h, &[], &Extensions::default());
        b.push(0);
        assert!(decode(&b).is_err());
        let f = encode_fail(&h, &[b'z'; 40]);
        assert!(matches!(decode(&f).unwrap().body, Body::Fail(n) if n == [b'z'; 40]));
        assert!(decode(&f[..f.len() - 1]).is_err());
        let mut first8 = [0u8; 8];
        first8[..4].copy_from_slice(b"RCmb");
        first8[4..].copy_from_slice(&10u32.to_be_bytes());
        assert_eq!(frame_len(&first8), None);
    }
}
