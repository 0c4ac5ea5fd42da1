//! The store protocol between simulated hosts: requests and answers as length-prefixed JSON
//! frames over turmoil-net's TCP (a 4-byte big-endian length, then the value), the bytes
//! crossing the simulated wire as a real client's would.

use std::time::Duration;

use bytes::{Buf, BytesMut};
use keyorder::drain::ParkedKeys;
use keyorder::store::StoreError;
use keyorder::{Epoch, PartitionId, Seq};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use turmoil_net::shim::tokio::net::TcpStream;

/// The store host's port.
pub const STORE_PORT: u16 = 5432;
/// The endpoint host's port.
pub const ENDPOINT_PORT: u16 = 80;

/// A request to the store.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum StoreRequest {
    /// Membership: this session is the worker's control session.
    Register { worker: String },
    /// Live workers (open control sessions).
    LiveWorkers,
    /// `pg_try_advisory_lock(namespace, partition)` on this session.
    TryLock { partition: PartitionId, worker: String },
    /// `pg_advisory_unlock(namespace, partition)`, recording how the lease is handed back:
    /// `clean` when no delivery of this holder can still be out.
    Unlock { partition: PartitionId, epoch: Epoch, clean: bool },
    /// Delete a delivered row, fenced.
    Ack { partition: PartitionId, epoch: Epoch, seq: Seq },
    /// A head read, fenced by the lease (PostgreSQL's head query, SQLite's read-ahead): up to
    /// `limit` rows with a seq above `after`, oldest first, none of a key in `skip` (the parked
    /// keys), ending at the first that waits; answered as [`StoreResponse::Heads`], which also
    /// says whether one of the `watched` transactions inserted a row at or below `after`.
    ReadAfter {
        partition: PartitionId,
        epoch: Epoch,
        after: Seq,
        skip: ParkedKeys,
        limit: u32,
        watched: Vec<u64>,
    },
    /// Delete buffered acknowledgements together, fenced (a session lease's batch delete).
    AckMany { partition: PartitionId, epoch: Epoch, seqs: Vec<Seq> },
    /// Delete the buffered acknowledgements of several expiry leases in one transaction
    /// (production SQLite's flush): each lease's rows only after its own fenced renewal.
    /// Answered with [`StoreResponse::Lost`], the leases whose renewal was refused.
    FlushAcks { leases: Vec<LeaseAcks> },
    /// Record a failed attempt, fenced.
    Retry {
        partition: PartitionId,
        epoch: Epoch,
        seq: Seq,
        attempts: u32,
        retry_in_us: u64,
        error: String,
    },
    /// Move a row to the dead-letter table, fenced.
    DeadLetter { partition: PartitionId, epoch: Epoch, seq: Seq, attempts: u32, reason: String },
    /// A producer's insert, uncommitted until `Commit`.
    Insert { event_id: String, key: String, partition: PartitionId, layout: u64 },
    /// Commit the producer's open insert.
    Commit,
    /// Mark this session a pooled connection (the `unfenced-lease` design only).
    Pooled,
    /// Does nothing; keeps a session from looking dead.
    Ping,
    /// Renew an expiry lease, fenced (the holder's renewal timer).
    Renew { partition: PartitionId, epoch: Epoch },
}

impl StoreRequest {
    /// The lease a request is fenced by, if it is a statement on a leased partition.
    pub fn fence(&self) -> Option<(PartitionId, Epoch)> {
        match self {
            StoreRequest::Unlock { partition, epoch, .. }
            | StoreRequest::Ack { partition, epoch, .. }
            | StoreRequest::ReadAfter { partition, epoch, .. }
            | StoreRequest::AckMany { partition, epoch, .. }
            | StoreRequest::Retry { partition, epoch, .. }
            | StoreRequest::DeadLetter { partition, epoch, .. }
            | StoreRequest::Renew { partition, epoch } => Some((*partition, *epoch)),
            _ => None,
        }
    }

    /// Whether the `unfenced-expiry` design leaves the epoch unchecked on this statement: the
    /// queue statements (head, acknowledgement, retry, dead-letter); renewals and hand-backs
    /// stay fenced.
    pub fn is_queue_statement(&self) -> bool {
        matches!(
            self,
            StoreRequest::Ack { .. }
                | StoreRequest::ReadAfter { .. }
                | StoreRequest::AckMany { .. }
                | StoreRequest::Retry { .. }
                | StoreRequest::DeadLetter { .. }
        )
    }
}

/// The store's answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum StoreResponse {
    /// Done.
    Ok,
    /// A count.
    Count(u64),
    /// The lease, or `None` when another session holds it.
    Lock(Option<Granted>),
    /// The oldest rows read, oldest first (a `ReadAfter`), the ids of the transactions the
    /// read's snapshot saw running (PostgreSQL's `pg_snapshot_xip`), and whether a watched
    /// one committed a row at or below the read's `after`.
    Heads { heads: Vec<WireHead>, running: Vec<u64>, late: bool },
    /// The insert is open (its seq is the store's; under expiry leases the commit takes it).
    Inserted,
    /// The event id was committed before (the unique constraint).
    Duplicate,
    /// A fenced statement from a session that does not hold the lease.
    NotHeld,
    /// Refused, with the reason.
    Refused(String),
    /// The leases of a `FlushAcks` whose renewal was refused: their rows were not deleted.
    Lost(Vec<LeaseId>),
    /// A fenced statement on an expiry lease went through and renewed the lease: it now
    /// lasts until `until_us` (store time, µs), and this is the statement's answer.
    Lasts { until_us: u64, answer: Box<StoreResponse> },
}

/// A granted lease: its epoch, and whether the previous holder handed it back cleanly (or
/// there never was one), so no delivery of an earlier holder can still be out.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Granted {
    pub epoch: Epoch,
    pub clean: bool,
    /// An expiry lease's expiry (store time, µs); absent for a session lock.
    pub until_us: Option<u64>,
}

/// One lease's buffered acknowledgements in a [`StoreRequest::FlushAcks`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LeaseAcks {
    pub partition: PartitionId,
    pub epoch: Epoch,
    pub seqs: Vec<Seq>,
}

/// A lease by partition and epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LeaseId {
    pub partition: PartitionId,
    pub epoch: Epoch,
}

/// A head row in a [`StoreResponse::Heads`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WireHead {
    pub seq: Seq,
    pub event_id: String,
    pub key: String,
    pub attempts: u32,
    pub wait_us: Option<u64>,
    pub last_error: Option<String>,
}

/// The largest frame a peer may send: a head read of a few hundred rows fits many times over.
const MAX_FRAME: usize = 1 << 20;

/// One connection carrying framed values. Cancel-safe: a send or receive dropped half-way keeps
/// what it had written or read, and the next call carries on from there.
pub struct Conn {
    stream: TcpStream,
    /// Bytes read and not yet taken as a frame.
    read: BytesMut,
    /// Frames encoded and not yet written.
    write: Vec<u8>,
}

impl Conn {
    /// Wraps a connected stream.
    pub fn new(stream: TcpStream) -> Self {
        Self { stream, read: BytesMut::with_capacity(512), write: Vec::with_capacity(256) }
    }

    /// Connects to `addr` within `timeout`.
    pub async fn connect(addr: (&str, u16), timeout: Duration) -> std::io::Result<Self> {
        match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Ok(stream) => Ok(Self::new(stream?)),
            Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")),
        }
    }

    /// Sends one value.
    pub async fn send<T: Serialize>(&mut self, msg: &T) -> std::io::Result<()> {
        let at = self.write.len();
        self.write.extend_from_slice(&[0; 4]);
        serde_json::to_writer(&mut self.write, msg).map_err(std::io::Error::other)?;
        let len = (self.write.len() - at - 4) as u32;
        self.write[at..at + 4].copy_from_slice(&len.to_be_bytes());
        self.flush().await
    }

    /// Writes what earlier sends left unwritten.
    async fn flush(&mut self) -> std::io::Result<()> {
        while !self.write.is_empty() {
            let n = self.stream.write(&self.write).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            self.write.drain(..n);
        }
        Ok(())
    }

    /// Receives one value; `None` at a clean end of stream.
    pub async fn recv<T: DeserializeOwned>(&mut self) -> std::io::Result<Option<T>> {
        self.flush().await?;
        loop {
            if self.read.len() >= 4 {
                let len =
                    u32::from_be_bytes([self.read[0], self.read[1], self.read[2], self.read[3]])
                        as usize;
                if len > MAX_FRAME {
                    return Err(invalid(format!("a frame of {len} bytes")));
                }
                if self.read.len() >= 4 + len {
                    self.read.advance(4);
                    let frame = self.read.split_to(len);
                    return serde_json::from_slice(&frame).map(Some).map_err(invalid);
                }
            }
            if self.stream.read_buf(&mut self.read).await? == 0 {
                return if self.read.is_empty() {
                    Ok(None)
                } else {
                    Err(std::io::ErrorKind::UnexpectedEof.into())
                };
            }
        }
    }

    /// [`Conn::recv`], or a `TimedOut` error when nothing arrives within `limit`.
    pub async fn recv_within<T: DeserializeOwned>(
        &mut self,
        limit: Duration,
    ) -> std::io::Result<Option<T>> {
        match tokio::time::timeout(limit, self.recv()).await {
            Ok(r) => r,
            Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out")),
        }
    }

    /// Sends `req` and waits up to `timeout` for the answer. A timeout or a closed stream is an
    /// error: the connection is presumed dead and must be dropped.
    pub async fn call(
        &mut self,
        req: &StoreRequest,
        operation: &'static str,
        timeout: Duration,
    ) -> Result<StoreResponse, StoreError> {
        self.send(req).await?;
        match self.recv_within::<StoreResponse>(timeout).await {
            Ok(Some(resp)) => Ok(resp),
            Ok(None) => Err(closed().into()),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                Err(StoreError::Timeout { operation, after: timeout })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Sends `req` and waits for the answer, for as long as it takes: for a call the worker's
    /// shared store wrapper already bounds by the request timeout
    /// ([`keyorder::store::timed`]). A closed stream is an error.
    pub async fn exchange(&mut self, req: &StoreRequest) -> Result<StoreResponse, StoreError> {
        self.send(req).await?;
        Ok(self.recv::<StoreResponse>().await?.ok_or_else(closed)?)
    }
}

fn invalid(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("a malformed frame: {e}"))
}

fn closed() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "store closed the session")
}
