//! A throwaway PostgreSQL server per test binary (or per test that restarts it): initdb into a
//! temporary folder, run as the `postgres` user when we are root (PostgreSQL refuses root), on
//! a free port with a private socket folder. Reported as not run ([`crate::skip`]) when no
//! server binaries exist, and fails instead when `KEYORDER_REQUIRE_PG=1` (CI sets it).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT: AtomicU32 = AtomicU32::new(0);

pub struct PgServer {
    dir: PathBuf,
    pub port: u16,
    as_postgres: bool,
}

/// The variable that makes a missing server (or pooler) fail the test instead of skipping it.
pub const REQUIRE: &str = "KEYORDER_REQUIRE_PG";

fn found(bin: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {bin}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether this process runs as root (PostgreSQL and PgBouncer must then run as `postgres`).
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

impl PgServer {
    /// Starts a server, or returns `None` (after reporting the test as not run) when
    /// PostgreSQL is not installed and not required.
    pub fn start() -> Option<PgServer> {
        if crate::skip::hidden("postgresql") || !(found("initdb") && found("pg_ctl")) {
            let needs =
                "PostgreSQL's initdb and pg_ctl on PATH (Debian: apt-get install postgresql)";
            crate::skip::skip(needs, REQUIRE);
            return None;
        }
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("keyorder-pg-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let as_postgres = is_root();
        let server = PgServer { dir, port: free_port(), as_postgres };
        if as_postgres {
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&server.dir)
                .status()
                .expect("chown");
            assert!(ok.success(), "chown of the temporary data folder failed");
        }
        server.run(
            &["initdb", "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync", "-D"],
            true,
        );
        // Another test may take the free port between our probe and the server's bind: retry
        // on a fresh port a few times before giving up.
        let mut server = server;
        for attempt in 0.. {
            match server.try_pg_ctl("start") {
                Ok(()) => break,
                Err(e) if attempt < 4 => {
                    eprintln!(
                        "PostgreSQL did not start on port {} ({e}); retrying on another",
                        server.port
                    );
                    server.port = free_port();
                }
                Err(e) => panic!("PostgreSQL did not start: {e}"),
            }
        }
        Some(server)
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    fn run(&self, args: &[&str], with_data: bool) {
        if let Err(e) = self.try_run(args, with_data) {
            panic!("{e}");
        }
    }

    fn try_run(&self, args: &[&str], with_data: bool) -> Result<(), String> {
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        if with_data {
            all.push(self.data());
        }
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).args(&all);
            c
        } else {
            let mut c = Command::new(&all[0]);
            c.args(&all[1..]);
            c
        };
        let out = cmd.output().map_err(|e| format!("{all:?}: {e}"))?;
        if out.status.success() {
            return Ok(());
        }
        let (o, e) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        Err(format!("{all:?} failed: {o}{e}"))
    }

    fn pg_ctl(&self, action: &str) {
        if let Err(e) = self.try_pg_ctl(action) {
            panic!("{e}");
        }
    }

    fn try_pg_ctl(&self, action: &str) -> Result<(), String> {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=on -c synchronous_commit=on",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("log").display().to_string();
        let data = self.data();
        let mut args =
            vec!["pg_ctl", action, "-w", "-t", "60", "-D", &data, "-l", &log, "-o", &opts];
        if action == "restart" {
            args.extend(["-m", "immediate"]);
        }
        self.try_run(&args, false)
    }

    /// `pg_ctl restart -m immediate`: every session dies, committed rows stay.
    pub fn restart_immediate(&self) {
        self.pg_ctl("restart");
    }

    /// `pg_ctl stop -m immediate`: the server is down (every session cut, nothing listening)
    /// until [`PgServer::start_again`].
    pub fn stop_immediate(&self) {
        let data = self.data();
        self.run(&["pg_ctl", "stop", "-w", "-m", "immediate", "-D", &data], false);
    }

    /// Starts the server stopped by [`PgServer::stop_immediate`] again, on the same port.
    pub fn start_again(&self) {
        self.pg_ctl("start");
    }

    /// A streaming standby of this server (`pg_basebackup -R`, so it follows this one), on a
    /// port of its own and started. With `synchronous`, this server waits for the standby to
    /// flush every commit before it acknowledges it (`synchronous_standby_names = '*'`, set and
    /// reloaded here).
    pub fn standby(&self, synchronous: bool) -> PgServer {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("keyorder-pg-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let standby = PgServer { dir, port: free_port(), as_postgres: self.as_postgres };
        if standby.as_postgres {
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&standby.dir)
                .status()
                .expect("chown");
            assert!(ok.success(), "chown of the standby's folder failed");
        }
        let port = self.port.to_string();
        let args = ["pg_basebackup", "-h", "127.0.0.1", "-p", &port, "-U", "postgres"];
        standby.run(&[&args[..], &["-c", "fast", "-R", "-X", "stream", "-D"]].concat(), true);
        standby.pg_ctl("start");
        if synchronous {
            let sql = "ALTER SYSTEM SET synchronous_standby_names = '*'";
            self.run(&["psql", "-h", "127.0.0.1", "-p", &port, "-U", "postgres", "-c", sql], false);
            let data = self.data();
            self.run(&["pg_ctl", "reload", "-D", &data], false);
        }
        standby
    }

    /// Promotes this standby to a primary (`pg_ctl promote`, waiting until it accepts writes).
    pub fn promote(&self) {
        let data = self.data();
        self.run(&["pg_ctl", "promote", "-w", "-t", "60", "-D", &data], false);
    }

    /// A URL for database `db`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Creates database `name` (one per test) and returns its URL.
    pub fn create_db(&self, name: &str) -> String {
        let out = Command::new("psql")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
            ])
            .arg(format!("CREATE DATABASE {name}"))
            .output()
            .expect("psql runs");
        assert!(out.status.success(), "create database: {}", String::from_utf8_lossy(&out.stderr));
        self.url(name)
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let data = self.data();
        let args = ["pg_ctl", "stop", "-m", "immediate", "-D", data.as_str()];
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).args(args);
            c
        } else {
            let mut c = Command::new(args[0]);
            c.args(&args[1..]);
            c
        };
        let _ = cmd.stdout(Stdio::null()).stderr(Stdio::null()).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}
