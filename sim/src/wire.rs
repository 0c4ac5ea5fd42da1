//! The byte encoding of the simulated hosts' messages: a little-endian `u32` length, then the
//! message's fields in declaration order (integers little-endian, strings and lists behind a
//! `u32` length, an option or an enum behind a one-byte tag).
//!
//! Hand-written rather than JSON because every simulated statement is encoded and decoded
//! once on each side: JSON was about a tenth of a sweep's time. The encoding has no bearing on
//! behaviour: turmoil delivers each write as one segment whatever its length, so a run's trace
//! is the same with either.

use keyorder::drain::ParkedKeys;
use keyorder::{Epoch, PartitionId, Seq};

use crate::protocol::{
    DeliveryRequest, DeliveryResponse, Granted, LeaseAcks, LeaseId, StoreRequest, StoreResponse,
    WireHead,
};

/// Why a frame could not be decoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The frame ended inside a field.
    #[error("frame ends inside a field")]
    Truncated,
    /// An enum or option tag no message uses.
    #[error("unknown tag {tag} for {what}")]
    Tag {
        /// The tag read.
        tag: u8,
        /// The type it was read for.
        what: &'static str,
    },
    /// A string that is not UTF-8.
    #[error("string is not UTF-8")]
    Utf8,
    /// Bytes left over after the message.
    #[error("{0} bytes after the message")]
    Trailing(usize),
}

/// A message that can cross a simulated connection.
pub trait Wire: Sized {
    /// Appends the message's fields to `out`.
    fn put(&self, out: &mut Vec<u8>);
    /// Reads the message's fields from `r`.
    fn take(r: &mut Reader<'_>) -> Result<Self, WireError>;

    /// Decodes a whole frame body: the message, and nothing after it.
    fn decode(body: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader(body);
        let msg = Self::take(&mut r)?;
        match r.0.len() {
            0 => Ok(msg),
            n => Err(WireError::Trailing(n)),
        }
    }
}

/// A cursor over a frame body.
pub struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.0.len() < n {
            return Err(WireError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut a = [0; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }

    fn tag(&mut self) -> Result<u8, WireError> {
        Ok(self.array::<1>()?[0])
    }

    fn len(&mut self) -> Result<usize, WireError> {
        Ok(u32::from_le_bytes(self.array()?) as usize)
    }
}

fn put_len(out: &mut Vec<u8>, n: usize) {
    // Frames are bounded far below 4 GiB (`protocol::MAX_FRAME`).
    out.extend_from_slice(&(n as u32).to_le_bytes());
}

macro_rules! int_wire {
    ($($t:ty),*) => {$(
        impl Wire for $t {
            fn put(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn take(r: &mut Reader<'_>) -> Result<Self, WireError> {
                Ok(<$t>::from_le_bytes(r.array()?))
            }
        }
    )*};
}
int_wire!(u16, u32, u64, i64);

impl Wire for bool {
    fn put(&self, out: &mut Vec<u8>) {
        out.push(u8::from(*self));
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, WireError> {
        match r.tag()? {
            0 => Ok(false),
            1 => Ok(true),
            tag => Err(WireError::Tag { tag, what: "bool" }),
        }
    }
}

impl Wire for String {
    fn put(&self, out: &mut Vec<u8>) {
        put_len(out, self.len());
        out.extend_from_slice(self.as_bytes());
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let n = r.len()?;
        let bytes = r.bytes(n)?;
        std::str::from_utf8(bytes).map(str::to_owned).map_err(|_| WireError::Utf8)
    }
}

impl<T: Wire> Wire for Option<T> {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            None => out.push(0),
            Some(v) => {
                out.push(1);
                v.put(out);
            }
        }
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, WireError> {
        match r.tag()? {
            0 => Ok(None),
            1 => T::take(r).map(Some),
            tag => Err(WireError::Tag { tag, what: "option" }),
        }
    }
}

impl<T: Wire> Wire for Vec<T> {
    fn put(&self, out: &mut Vec<u8>) {
        put_len(out, self.len());
        self.iter().for_each(|v| v.put(out));
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let n = r.len()?;
        // Every element takes at least a byte: a forged length cannot make this allocate more
        // than the frame's own size.
        if n > r.0.len() {
            return Err(WireError::Truncated);
        }
        (0..n).map(|_| T::take(r)).collect()
    }
}

macro_rules! newtype_wire {
    ($($t:ident($inner:ty)),*) => {$(
        impl Wire for $t {
            fn put(&self, out: &mut Vec<u8>) {
                self.0.put(out);
            }
            fn take(r: &mut Reader<'_>) -> Result<Self, WireError> {
                <$inner>::take(r).map($t)
            }
        }
    )*};
}
newtype_wire!(Seq(i64), Epoch(u64), PartitionId(u16));

impl Wire for ParkedKeys {
    fn put(&self, out: &mut Vec<u8>) {
        put_len(out, self.len());
        self.as_slice().iter().for_each(|k| k.put(out));
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Vec::<String>::take(r).map(ParkedKeys::new)
    }
}

/// `Wire` for a struct: its fields in order.
macro_rules! struct_wire {
    ($t:ident { $($f:ident),* }) => {
        impl Wire for $t {
            fn put(&self, out: &mut Vec<u8>) {
                $(self.$f.put(out);)*
            }
            fn take(r: &mut Reader<'_>) -> Result<Self, WireError> {
                Ok($t { $($f: Wire::take(r)?),* })
            }
        }
    };
}
struct_wire!(Granted { epoch, clean, until_us });
struct_wire!(WireHead { seq, event_id, key, attempts, wait_us, last_error });
struct_wire!(DeliveryRequest { delivery, partition, seq, event_id, key, attempt });
struct_wire!(DeliveryResponse { status, retry_after_ms });
struct_wire!(LeaseAcks { partition, epoch, seqs });
struct_wire!(LeaseId { partition, epoch });

/// `Wire` for an enum: a tag byte (the variant's position), then the variant's fields.
macro_rules! enum_wire {
    ($t:ident: $($tag:literal => $v:ident $({ $($f:ident),* })? $(( $x:ident ))?),* $(,)?) => {
        impl Wire for $t {
            fn put(&self, out: &mut Vec<u8>) {
                match self {
                    $($t::$v $({ $($f),* })? $(( $x ))? => {
                        out.push($tag);
                        $($($f.put(out);)*)?
                        $($x.put(out);)?
                    })*
                }
            }
            fn take(r: &mut Reader<'_>) -> Result<Self, WireError> {
                match r.tag()? {
                    $($tag => Ok($t::$v $({ $($f: Wire::take(r)?),* })? $(( { let $x = Wire::take(r)?; $x } ))?),)*
                    tag => Err(WireError::Tag { tag, what: stringify!($t) }),
                }
            }
        }
    };
}

enum_wire!(StoreRequest:
    0 => Register { worker },
    1 => LiveWorkers,
    2 => TryLock { partition, worker },
    3 => Unlock { partition, epoch, clean },
    5 => Ack { partition, epoch, seq },
    6 => Retry { partition, epoch, seq, attempts, retry_in_us, error },
    7 => DeadLetter { partition, epoch, seq, attempts, reason },
    8 => Insert { event_id, key, partition, layout },
    9 => Commit,
    10 => Pooled,
    11 => Ping,
    12 => Renew { partition, epoch },
    13 => ReadAfter { partition, epoch, after, skip, limit, watched },
    14 => AckMany { partition, epoch, seqs },
    15 => FlushAcks { leases },
);

enum_wire!(StoreResponse:
    0 => Ok,
    1 => Count(n),
    2 => Lock(granted),
    4 => Heads { heads, running, late },
    5 => Inserted(seq),
    6 => Duplicate,
    7 => NotHeld,
    8 => Refused(reason),
    9 => Lasts { until_us, answer },
    10 => Lost(leases),
);

impl<T: Wire> Wire for Box<T> {
    fn put(&self, out: &mut Vec<u8>) {
        (**self).put(out);
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, WireError> {
        T::take(r).map(Box::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T: Wire + std::fmt::Debug>(msg: T) {
        let mut out = Vec::new();
        msg.put(&mut out);
        let back = T::decode(&out).expect("decodes");
        assert_eq!(format!("{back:?}"), format!("{msg:?}"));
        for cut in 0..out.len() {
            assert!(T::decode(&out[..cut]).is_err(), "{msg:?} cut at {cut} decoded");
        }
        out.push(0);
        assert!(matches!(T::decode(&out), Err(WireError::Trailing(1))));
    }

    fn head(seq: i64) -> WireHead {
        WireHead {
            seq: Seq(seq),
            event_id: format!("e{seq}"),
            key: "tenant-é".into(),
            attempts: 2,
            wait_us: Some(1_500),
            last_error: None,
        }
    }

    #[test]
    fn every_message_comes_back_as_it_went() {
        let (p, e) = (PartitionId(7), Epoch(u64::MAX));
        let skip = ParkedKeys::new(["b".to_owned(), "a".to_owned()]);
        for req in [
            StoreRequest::Register { worker: "w0".into() },
            StoreRequest::LiveWorkers,
            StoreRequest::TryLock { partition: p, worker: "w1".into() },
            StoreRequest::Unlock { partition: p, epoch: e, clean: true },
            StoreRequest::Ack { partition: p, epoch: e, seq: Seq(-3) },
            StoreRequest::Retry {
                partition: p,
                epoch: e,
                seq: Seq(4),
                attempts: 3,
                retry_in_us: 9,
                error: "503".into(),
            },
            StoreRequest::DeadLetter {
                partition: p,
                epoch: e,
                seq: Seq(5),
                attempts: 4,
                reason: "poison".into(),
            },
            StoreRequest::Insert {
                event_id: "e1".into(),
                key: "k".into(),
                partition: p,
                layout: 2,
            },
            StoreRequest::Commit,
            StoreRequest::Pooled,
            StoreRequest::Ping,
            StoreRequest::Renew { partition: p, epoch: e },
            StoreRequest::ReadAfter {
                partition: p,
                epoch: e,
                after: Seq(3),
                skip,
                limit: 64,
                watched: vec![7, 9],
            },
            StoreRequest::ReadAfter {
                partition: p,
                epoch: e,
                after: Seq(0),
                skip: ParkedKeys::NONE,
                limit: 1,
                watched: vec![],
            },
            StoreRequest::FlushAcks {
                leases: vec![
                    LeaseAcks { partition: p, epoch: e, seqs: vec![Seq(1)] },
                    LeaseAcks { partition: PartitionId(0), epoch: Epoch(2), seqs: vec![] },
                ],
            },
            StoreRequest::AckMany { partition: p, epoch: e, seqs: vec![Seq(1), Seq(2)] },
        ] {
            round_trip(req);
        }
        let granted = Granted { epoch: e, clean: false, until_us: Some(77) };
        for resp in [
            StoreResponse::Ok,
            StoreResponse::Count(12),
            StoreResponse::Lock(None),
            StoreResponse::Lock(Some(granted)),
            StoreResponse::Lost(vec![]),
            StoreResponse::Lost(vec![LeaseId { partition: p, epoch: e }]),
            StoreResponse::Heads { heads: vec![head(1), head(2)], running: vec![3, 7], late: true },
            StoreResponse::Inserted(Seq(9)),
            StoreResponse::Duplicate,
            StoreResponse::NotHeld,
            StoreResponse::Refused("no".into()),
            StoreResponse::Lasts {
                until_us: 5,
                answer: Box::new(StoreResponse::Heads {
                    heads: vec![head(3)],
                    running: vec![],
                    late: false,
                }),
            },
        ] {
            round_trip(resp);
        }
        round_trip(DeliveryRequest {
            delivery: 1,
            partition: p,
            seq: Seq(2),
            event_id: "e".into(),
            key: "k".into(),
            attempt: 1,
        });
        round_trip(DeliveryResponse { status: 429, retry_after_ms: Some(100) });
    }

    #[test]
    fn bad_frames_are_errors_not_panics() {
        assert!(matches!(
            StoreRequest::decode(&[200]),
            Err(WireError::Tag { tag: 200, what: "StoreRequest" })
        ));
        // A list claiming more elements than the frame has bytes.
        let mut forged = vec![4];
        forged.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(StoreResponse::decode(&forged), Err(WireError::Truncated)));
        // Invalid UTF-8 in a string.
        let mut bad = vec![0];
        bad.extend_from_slice(&1u32.to_le_bytes());
        bad.push(0xff);
        assert!(matches!(StoreRequest::decode(&bad), Err(WireError::Utf8)));
    }
}
