//! The remotedialer wire format: one WebSocket binary message per frame, a header of Go
//! `binary.PutVarint` integers (zig-zag varints) — message id, connection id, message type, and
//! for Data and Connect a legacy deadline nobody reads any more — then the payload.

use thiserror::Error;

/// The message types, numbered as rancher/remotedialer numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Type {
    Data = 1,
    Connect = 2,
    Error = 3,
    AddClient = 4,
    RemoveClient = 5,
    Pause = 6,
    Resume = 7,
    SyncConnections = 8,
}

impl Type {
    fn from_i64(v: i64) -> Option<Type> {
        Some(match v {
            1 => Type::Data,
            2 => Type::Connect,
            3 => Type::Error,
            4 => Type::AddClient,
            5 => Type::RemoveClient,
            6 => Type::Pause,
            7 => Type::Resume,
            8 => Type::SyncConnections,
            _ => return None,
        })
    }
}

/// What remotedialer writes in the deadline field (15 s in milliseconds); readers skip it.
const LEGACY_DEADLINE_MS: i64 = 15_000;
/// Longest Connect payload a peer reads (`proto/address`).
const MAX_CONNECT: usize = 266;
/// Longest Error payload a peer reads.
pub const MAX_ERROR: usize = 100;

/// One decoded frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub id: i64,
    pub conn_id: i64,
    pub kind: Type,
    pub payload: Vec<u8>,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum WireError {
    #[error("truncated frame header")]
    Truncated,
    #[error("varint overflows 64 bits")]
    Overflow,
    #[error("unknown message type {0}")]
    UnknownType(i64),
    #[error("connect payload is not proto/address")]
    BadConnect,
}

fn put_varint(out: &mut Vec<u8>, v: i64) {
    // Go's PutVarint: zig-zag, then unsigned LEB128.
    let mut u = ((v << 1) ^ (v >> 63)) as u64;
    while u >= 0x80 {
        out.push((u as u8) | 0x80);
        u >>= 7;
    }
    out.push(u as u8);
}

fn get_varint(buf: &[u8], at: &mut usize) -> Result<i64, WireError> {
    let mut u: u64 = 0;
    let mut shift = 0;
    loop {
        let b = *buf.get(*at).ok_or(WireError::Truncated)?;
        *at += 1;
        if shift == 63 && b > 1 {
            return Err(WireError::Overflow);
        }
        u |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            break;
        }
        shift += 7;
        if shift > 63 {
            return Err(WireError::Overflow);
        }
    }
    Ok(((u >> 1) as i64) ^ -((u & 1) as i64))
}

impl Frame {
    pub fn new(id: i64, conn_id: i64, kind: Type, payload: Vec<u8>) -> Frame {
        Frame {
            id,
            conn_id,
            kind,
            payload,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(24 + self.payload.len());
        put_varint(&mut out, self.id);
        put_varint(&mut out, self.conn_id);
        put_varint(&mut out, self.kind as i64);
        if matches!(self.kind, Type::Data | Type::Connect) {
            put_varint(&mut out, LEGACY_DEADLINE_MS);
        }
        out.extend_from_slice(&self.payload);
        out
    }

    pub fn decode(buf: &[u8]) -> Result<Frame, WireError> {
        let mut at = 0;
        let id = get_varint(buf, &mut at)?;
        let conn_id = get_varint(buf, &mut at)?;
        let raw = get_varint(buf, &mut at)?;
        let kind = Type::from_i64(raw).ok_or(WireError::UnknownType(raw))?;
        if matches!(kind, Type::Data | Type::Connect) {
            get_varint(buf, &mut at)?;
        }
        let mut payload = buf[at..].to_vec();
        match kind {
            Type::Connect => payload.truncate(MAX_CONNECT),
            Type::Error => payload.truncate(MAX_ERROR),
            _ => {}
        }
        Ok(Frame {
            id,
            conn_id,
            kind,
            payload,
        })
    }

    /// The `(proto, address)` of a Connect frame.
    pub fn connect_target(&self) -> Result<(String, String), WireError> {
        let text = std::str::from_utf8(&self.payload).map_err(|_| WireError::BadConnect)?;
        let (proto, address) = text.split_once('/').ok_or(WireError::BadConnect)?;
        Ok((proto.to_string(), address.to_string()))
    }
}

/// The payload of a SyncConnections frame: the ids, each as 8 little-endian bytes.
pub fn encode_ids(ids: &[i64]) -> Vec<u8> {
    ids.iter().flat_map(|id| id.to_le_bytes()).collect()
}

/// The message of an Error frame; `None` is remotedialer's clean close (`EOF`).
pub fn error_message(payload: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(payload);
    (text != "EOF").then(|| text.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes Go's remotedialer writes, worked out from `binary.PutVarint`: a Data frame with id 1,
    /// connection 2 and payload "hi" is 02 04 02 b0ea01 'h' 'i' (15000 zig-zags to 30000).
    #[test]
    fn data_frame_matches_go() {
        let f = Frame::new(1, 2, Type::Data, b"hi".to_vec());
        assert_eq!(
            f.encode(),
            vec![0x02, 0x04, 0x02, 0xb0, 0xea, 0x01, b'h', b'i']
        );
        assert_eq!(Frame::decode(&f.encode()).unwrap(), f);
    }

    #[test]
    fn error_frames_have_no_deadline_and_eof_is_clean() {
        let f = Frame::new(-3, 7, Type::Error, b"EOF".to_vec());
        // -3 zig-zags to 5.
        assert_eq!(f.encode(), vec![0x05, 0x0e, 0x06, b'E', b'O', b'F']);
        let back = Frame::decode(&f.encode()).unwrap();
        assert_eq!(error_message(&back.payload), None);
        assert_eq!(error_message(b"dial refused"), Some("dial refused".into()));
    }

    #[test]
    fn large_ids_round_trip() {
        for id in [0, 1, -1, i64::MAX, i64::MIN, 1 << 40, -(1 << 50)] {
            let f = Frame::new(id, id.wrapping_mul(3), Type::Pause, vec![]);
            assert_eq!(Frame::decode(&f.encode()).unwrap(), f);
        }
    }

    #[test]
    fn connect_payload_is_proto_and_address() {
        let f = Frame::new(9, 1, Type::Connect, b"tcp/stv-abc:80".to_vec());
        let back = Frame::decode(&f.encode()).unwrap();
        assert_eq!(
            back.connect_target().unwrap(),
            ("tcp".to_string(), "stv-abc:80".to_string())
        );
        let bad = Frame::new(9, 1, Type::Connect, b"nothing".to_vec());
        assert_eq!(bad.connect_target(), Err(WireError::BadConnect));
    }

    #[test]
    fn malformed_frames_are_errors_not_panics() {
        assert_eq!(Frame::decode(&[]), Err(WireError::Truncated));
        assert_eq!(Frame::decode(&[0x02, 0x04]), Err(WireError::Truncated));
        assert_eq!(
            Frame::decode(&[0x02, 0x04, 0x7e]),
            Err(WireError::UnknownType(63))
        );
        assert_eq!(Frame::decode(&[0xff; 11]), Err(WireError::Overflow));
        // A Data frame missing its deadline.
        assert_eq!(
            Frame::decode(&[0x02, 0x04, 0x02]),
            Err(WireError::Truncated)
        );
    }

    #[test]
    fn sync_ids_are_little_endian_u64s() {
        assert_eq!(
            encode_ids(&[1, 258]),
            vec![1, 0, 0, 0, 0, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0]
        );
    }
}
