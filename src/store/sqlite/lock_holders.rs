//! Who holds a SQLite database's file locks when a write gave up waiting for them.
//!
//! SQLite's write lock is a POSIX byte-range lock on the database's `-shm` file (WAL mode),
//! which only the holder's commit or its end releases. A holder that is stopped (SIGSTOP, a
//! debugger, a frozen container) keeps every other writer on the file waiting, workers and
//! producers alike, and no lease can bound that. When a statement gives up after the busy
//! timeout (`SQLITE_BUSY`), the store names the processes holding locks on the database, its
//! `-wal` and its `-shm` (from `/proc/locks`), with their state and command line, so that an
//! operator sees at once whether a stopped process is to blame and which one.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::store::StoreError;

/// A process holding a lock on a SQLite database's files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileLockHolder {
    /// Its process id.
    pub pid: u32,
    /// Its state as the kernel reports it (`/proc/PID/stat`), one letter: `R` running, `S`
    /// sleeping, `D` waiting on I/O, `T` stopped, `t` stopped by a debugger, `Z` a zombie.
    pub state: char,
    /// Its command line, shortened (empty when it could not be read).
    pub command: String,
}

impl FileLockHolder {
    /// Whether the process is stopped, and so holds its locks until it is resumed or ended.
    pub fn is_stopped(&self) -> bool {
        matches!(self.state, 'T' | 't')
    }

    fn state_name(&self) -> &'static str {
        match self.state {
            'R' => "running",
            'S' => "sleeping",
            'D' => "waiting on I/O",
            'T' => "stopped",
            't' => "stopped by a debugger",
            'Z' => "a zombie",
            'I' => "idle",
            _ => "in an unknown state",
        }
    }
}

impl fmt::Display for FileLockHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {}", self.pid)?;
        if !self.command.is_empty() {
            write!(f, " ({})", self.command)?;
        }
        write!(f, ", {}", self.state_name())
    }
}

/// The holders as one line, and what to do about them.
pub(crate) fn holders_text(holders: &[FileLockHolder]) -> String {
    if holders.is_empty() {
        return "no process on this host holds a lock on it that this process can see (the \
                holder may run in another PID namespace or on another host); wait, or find \
                the writer"
            .to_owned();
    }
    let list: Vec<String> = holders.iter().map(ToString::to_string).collect();
    let mut text = format!("held by {}", list.join("; "));
    if let Some(stopped) = holders.iter().find(|h| h.is_stopped()) {
        text.push_str(&format!(
            ". A stopped process keeps SQLite's write lock until it resumes or ends: resume it \
             (kill -CONT {pid}) or end it (kill {pid}); supervise SQLite workers with a kill, \
             not a stop, or use PostgreSQL",
            pid = stopped.pid
        ));
    } else {
        text.push_str(". They are writing: if this lasts, one of them is stuck inside a write");
    }
    text
}

/// `error` as [`StoreError::FileLocked`] when it is SQLite's `SQLITE_BUSY` (a write that gave
/// up after `waited`), naming the holders of `database`'s locks; any other error unchanged.
pub(crate) fn explain_busy(error: StoreError, database: &Path, waited: Duration) -> StoreError {
    if super::error::sqlite_code(&error) != Some(rusqlite::ErrorCode::DatabaseBusy) {
        return error;
    }
    StoreError::FileLocked { database: database.to_owned(), waited, holders: holders(database) }
}

/// The processes other than this one that hold a lock on `database`, its `-wal` or its `-shm`,
/// in pid order; empty where `/proc/locks` cannot be read.
pub fn holders(database: &Path) -> Vec<FileLockHolder> {
    let files: Vec<(u32, u32, u64)> =
        [suffixed(database, ""), suffixed(database, "-wal"), suffixed(database, "-shm")]
            .iter()
            .filter_map(|p| identity(p))
            .collect();
    let Ok(locks) = std::fs::read_to_string("/proc/locks") else { return Vec::new() };
    let own = std::process::id();
    let mut pids = lock_pids(&locks, &files);
    pids.retain(|p| *p != own);
    pids.into_iter().map(describe).collect()
}

fn suffixed(database: &Path, suffix: &str) -> PathBuf {
    let mut name = database.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// A file's device (major, minor) and inode, as `/proc/locks` names them.
fn identity(path: &Path) -> Option<(u32, u32, u64)> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some((rustix::fs::major(meta.dev()), rustix::fs::minor(meta.dev()), meta.ino()))
}

/// The pids holding (not waiting for) a lock on one of `files` in `/proc/locks` text, sorted
/// and without repeats. A line reads `1: POSIX  ADVISORY  WRITE 4242 08:01:1234 120 120`
/// (device in hex, inode in decimal); a waiter's line has `->` after the number.
fn lock_pids(locks: &str, files: &[(u32, u32, u64)]) -> Vec<u32> {
    let mut pids: Vec<u32> = locks
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.get(1) == Some(&"->") {
                return None;
            }
            let pid: u32 = fields.get(4)?.parse().ok()?;
            let mut id = fields.get(5)?.split(':');
            let major = u32::from_str_radix(id.next()?, 16).ok()?;
            let minor = u32::from_str_radix(id.next()?, 16).ok()?;
            let inode: u64 = id.next()?.parse().ok()?;
            files.contains(&(major, minor, inode)).then_some(pid)
        })
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

fn describe(pid: u32) -> FileLockHolder {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let command = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    FileLockHolder { pid, state: state_of(&stat), command: command_line(&command) }
}

/// The state letter of a `/proc/PID/stat` line: the first field after the command name, which
/// is in parentheses and may itself contain spaces and parentheses.
fn state_of(stat: &str) -> char {
    stat.rfind(')')
        .and_then(|end| stat[end + 1..].split_whitespace().next())
        .and_then(|s| s.chars().next())
        .unwrap_or('?')
}

/// A `/proc/PID/cmdline` (arguments separated by NULs) as one line of at most 100 characters.
fn command_line(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let line = text.trim_end_matches('\0').replace('\0', " ");
    if line.chars().count() > 100 {
        let cut: String = line.chars().take(97).collect();
        format!("{cut}...")
    } else {
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCKS: &str = "\
1: POSIX  ADVISORY  READ 4242 08:01:5551 128 128
1: -> POSIX  ADVISORY  WRITE 777 08:01:5551 120 120
2: POSIX  ADVISORY  WRITE 4242 08:01:5551 120 120
3: POSIX  ADVISORY  WRITE 99 fd:00:5551 0 EOF
4: FLOCK  ADVISORY  WRITE 31 08:01:12 0 EOF
5: POSIX  ADVISORY  READ 17 08:01:6000 0 EOF
";

    #[test]
    fn holders_are_the_lockers_of_the_files_not_their_waiters_nor_other_devices() {
        // The shm file is inode 5551 on device 8:1; 6000 is the database itself.
        assert_eq!(lock_pids(LOCKS, &[(8, 1, 5551), (8, 1, 6000)]), [17, 4242]);
        assert_eq!(lock_pids(LOCKS, &[(0xfd, 0, 5551)]), [99]);
        assert!(lock_pids(LOCKS, &[(8, 1, 1)]).is_empty());
    }

    #[test]
    fn the_state_is_read_after_the_command_name_whatever_it_contains() {
        assert_eq!(state_of("4242 (keyorder) T 1 4242 4242 0 -1"), 'T');
        assert_eq!(state_of("4242 (a) b (c)) S 1 2"), 'S');
        assert_eq!(state_of(""), '?');
    }

    #[test]
    fn a_stopped_holder_is_named_with_what_to_do() {
        let stopped = FileLockHolder { pid: 4242, state: 'T', command: "keyorder work".into() };
        let text = holders_text(&[stopped]);
        assert!(text.contains("pid 4242 (keyorder work), stopped"), "{text}");
        assert!(text.contains("kill -CONT 4242"), "{text}");
        let running = FileLockHolder { pid: 7, state: 'R', command: String::new() };
        assert!(!holders_text(&[running]).contains("kill"));
        assert!(holders_text(&[]).contains("another PID namespace"));
    }

    #[test]
    fn a_long_command_line_is_shortened_and_its_arguments_spaced() {
        assert_eq!(command_line(b"keyorder\0work\0--name\0a\0"), "keyorder work --name a");
        let long = vec![b'x'; 300];
        assert_eq!(command_line(&long).chars().count(), 100);
    }
}
