//! Chunks of lines through a pipeline: read ahead, process on every core, consume in order.
//!
//! The calling thread reads chunks of whole lines (about [`CHUNK_BYTES`] each, cut as
//! [`super::chunks::for_each_chunk`] cuts them) into a fixed set of buffers and hands each to whichever worker
//! is free; it consumes the finished chunks strictly in input order (writing, counting), then
//! refills the buffer. Reading, processing and writing overlap: no barrier waits for the
//! slowest part of a chunk, and no thread is spawned per chunk. Memory stays bounded by the
//! number of buffers, [`slots`], whatever the input's length; output order never depends on
//! the threads.

use std::io::{self, Read};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Mutex;

use anyhow::Context;

use super::chunks::CHUNK_BYTES;

/// A chunk in flight: its bytes, its place in the input and what the work leaves for the
/// consumer.
struct Job<S> {
    seq: u64,
    /// The buffer; its first `len` bytes are whole lines.
    buf: Vec<u8>,
    len: usize,
    state: S,
}

/// What a worker sends back: a processed chunk, or news that it panicked (so the calling thread
/// stops waiting; the scope then propagates the panic).
enum Done<S> {
    Chunk(Job<S>),
    Panicked,
}

/// Worker threads: one per core, at most 16.
fn workers() -> usize {
    std::thread::available_parallelism().map_or(1, |p| p.get()).clamp(1, 16)
}

/// Buffers in flight: one per worker, one being consumed and one read ahead.
fn slots(workers: usize) -> usize {
    workers + 2
}

/// Runs `work(lines, state)` on every chunk of whole lines of `input` (the last line may lack
/// its `\n`) on worker threads, then `consume(lines, state)` on the calling thread in input
/// order. `state` is reused from chunk to chunk (it keeps its allocations). The first error of
/// reading or of `consume` stops the pipeline and is returned; later chunks are not consumed.
pub fn run<R, S, W, C>(input: R, work: W, consume: C) -> anyhow::Result<()>
where
    R: Read,
    S: Default + Send,
    W: Fn(&[u8], &mut S) + Sync,
    C: FnMut(&[u8], &mut S) -> anyhow::Result<()>,
{
    let workers = workers();
    let (todo_tx, todo_rx) = mpsc::channel::<Job<S>>();
    let todo_rx = Mutex::new(todo_rx);
    // Unbounded, but never holds more than `slots` jobs: only that many exist.
    let (done_tx, done_rx) = mpsc::channel::<Done<S>>();
    std::thread::scope(|scope| {
        for _ in 0..workers {
            let (todo_rx, done_tx, work) = (&todo_rx, done_tx.clone(), &work);
            scope.spawn(move || worker(todo_rx, done_tx, work));
        }
        drop(done_tx);
        let result = drive(input, slots(workers), &todo_tx, &done_rx, consume);
        // Closing the queue lets the workers return, so the scope can end.
        drop(todo_tx);
        result
    })
}

/// A worker: takes the next chunk, processes it, sends it back, until the queue closes.
fn worker<S, W: Fn(&[u8], &mut S)>(
    todo: &Mutex<Receiver<Job<S>>>,
    done: Sender<Done<S>>,
    work: &W,
) {
    let guard = PanicGuard(done);
    loop {
        // The lock is held only while waiting for a job; a poisoned lock means another worker
        // panicked while waiting, and the scope reports that panic.
        let next = match todo.lock() {
            Ok(todo) => todo.recv(),
            Err(_) => return,
        };
        let Ok(mut job) = next else { return };
        work(&job.buf[..job.len], &mut job.state);
        if guard.0.send(Done::Chunk(job)).is_err() {
            return;
        }
    }
}

/// Tells the calling thread when its worker unwinds, so it does not wait for a lost chunk.
struct PanicGuard<S>(Sender<Done<S>>);

impl<S> Drop for PanicGuard<S> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = self.0.send(Done::Panicked);
        }
    }
}

/// The calling thread's loop: keep every free buffer filled and queued, then consume the next
/// chunk in order as soon as it is done, until the input ends and every chunk is consumed.
fn drive<R: Read, S: Default, C>(
    mut input: R,
    slots: usize,
    todo: &Sender<Job<S>>,
    done: &Receiver<Done<S>>,
    mut consume: C,
) -> anyhow::Result<()>
where
    C: FnMut(&[u8], &mut S) -> anyhow::Result<()>,
{
    let mut free: Vec<Job<S>> = (0..slots)
        .map(|_| Job { seq: 0, buf: vec![0; CHUNK_BYTES], len: 0, state: S::default() })
        .collect();
    // Finished chunks waiting for their turn, at `seq % slots`: at most `slots` are in flight,
    // so their sequence numbers never collide.
    let mut finished: Vec<Option<Job<S>>> = (0..slots).map(|_| None).collect();
    let mut carry = Vec::new();
    let (mut queued, mut consumed, mut eof) = (0u64, 0u64, false);
    loop {
        while !eof {
            let Some(mut job) = free.pop() else { break };
            eof = fill(&mut input, &mut job, &mut carry)?;
            if job.len == 0 {
                free.push(job);
                continue;
            }
            job.seq = queued;
            queued += 1;
            todo.send(job).map_err(|_| anyhow::anyhow!("route workers stopped"))?;
        }
        if consumed == queued {
            return Ok(());
        }
        let at = (consumed % slots as u64) as usize;
        while finished[at].is_none() {
            match done.recv() {
                Ok(Done::Chunk(job)) => {
                    let slot = (job.seq % slots as u64) as usize;
                    debug_assert!(finished[slot].is_none(), "one chunk per slot");
                    finished[slot] = Some(job);
                }
                Ok(Done::Panicked) | Err(_) => anyhow::bail!("a route worker panicked"),
            }
        }
        let mut job = finished[at].take().context("waited for it above")?;
        debug_assert_eq!(job.seq, consumed, "consumed in input order");
        consume(&job.buf[..job.len], &mut job.state)?;
        consumed += 1;
        free.push(job);
    }
}

/// Fills `job` with `carry` (the unfinished line of the previous chunk) and then input, up to
/// its last whole line (all of it at the end of input); what follows goes back into `carry`.
/// Returns whether the input has ended.
fn fill<R: Read>(
    input: &mut R,
    job: &mut Job<impl Sized>,
    carry: &mut Vec<u8>,
) -> anyhow::Result<bool> {
    let buf = &mut job.buf;
    if buf.len() < carry.len() * 2 {
        buf.resize(carry.len() * 2, 0);
    }
    buf[..carry.len()].copy_from_slice(carry);
    let mut filled = carry.len();
    carry.clear();
    loop {
        let mut eof = false;
        while filled < buf.len() {
            match input.read(&mut buf[filled..]) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e).context("reading keys"),
            }
        }
        let end = if eof {
            filled
        } else {
            match buf[..filled].iter().rposition(|&b| b == b'\n') {
                Some(i) => i + 1,
                None => {
                    // One line longer than the buffer: grow it and read on.
                    buf.resize(buf.len() * 2, 0);
                    continue;
                }
            }
        };
        carry.extend_from_slice(&buf[end..filled]);
        job.len = end;
        return Ok(eof);
    }
}

#[cfg(test)]
mod tests {
    use super::super::chunks;
    use super::*;

    /// A reader that returns at most `step` bytes per call, so chunk ends fall anywhere.
    struct Trickle<'a> {
        data: &'a [u8],
        step: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.step.min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    /// Every line of `input` as the pipeline delivers it, in the order it is consumed.
    fn through_pipeline(input: &[u8], step: usize) -> Vec<String> {
        let mut seen = Vec::new();
        run(
            Trickle { data: input, step },
            |lines, keys: &mut Vec<String>| {
                let text = std::str::from_utf8(lines).expect("utf-8");
                let mut split = Vec::new();
                chunks::split_keys(text, &mut split);
                *keys = split.into_iter().map(str::to_owned).collect();
            },
            |_, keys| {
                seen.append(keys);
                Ok(())
            },
        )
        .expect("runs");
        seen
    }

    #[test]
    fn lines_arrive_whole_and_in_order_across_chunks() {
        // CRLF and LF lines, empty lines, one line longer than a chunk, no final newline; the
        // lengths put a `\r\n` across a chunk boundary somewhere.
        let mut input = Vec::new();
        for i in 0..120_000 {
            let end = if i % 3 == 0 { "\r\n" } else { "\n" };
            let key = if i % 7 == 0 { String::new() } else { format!("sub_{i:0>19}") };
            input.extend_from_slice(format!("{key}{end}").as_bytes());
        }
        input.extend_from_slice(&vec![b'x'; CHUNK_BYTES * 3 / 2]);
        input.extend_from_slice(b"\r\nlast\r");
        let text = std::str::from_utf8(&input).expect("utf-8");
        let expected: Vec<String> = chunks::lines(text).map(str::to_owned).collect();
        assert!(input.len() > 3 * CHUNK_BYTES, "several chunks");
        for step in [input.len(), 65_536, 4093] {
            assert!(through_pipeline(&input, step) == expected, "read {step} bytes at a time");
        }
        // A `\r\n` exactly across the first chunk's end.
        let mut edge = vec![b'a'; CHUNK_BYTES - 1];
        edge.extend_from_slice(b"\r\nb\n");
        assert_eq!(through_pipeline(&edge, 1 << 16).len(), 2);
        assert_eq!(through_pipeline(&edge, 1 << 16)[0].len(), CHUNK_BYTES - 1);
        assert!(through_pipeline(b"", 1).is_empty());
    }

    #[test]
    fn the_first_error_stops_it() {
        let input = vec![b'k'; 10 * CHUNK_BYTES].chunks(100).collect::<Vec<_>>().join(&b'\n');
        let mut consumed = 0;
        let result = run(
            &input[..],
            |_, _: &mut ()| {},
            |_, _| {
                consumed += 1;
                anyhow::ensure!(consumed < 3, "enough");
                Ok(())
            },
        );
        assert_eq!(result.expect_err("stops").to_string(), "enough");
        assert_eq!(consumed, 3);
    }

    #[test]
    fn a_panicking_worker_does_not_hang_it() {
        let result = std::panic::catch_unwind(|| {
            run(&b"a\nb\n"[..], |_, _: &mut ()| panic!("a bug in the work"), |_, _| Ok(()))
        });
        assert!(result.is_err(), "the panic reaches the caller");
    }
}
