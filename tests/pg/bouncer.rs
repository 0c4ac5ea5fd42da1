//! A throwaway PgBouncer (Debian's `pgbouncer`) in front of a throwaway server, in the pooling
//! mode a test asks for. Reported as not run ([`crate::skip`]) when pgbouncer is not installed,
//! and fails instead when `KEYORDER_REQUIRE_PG=1` (CI sets it, and `.ci/run` installs it).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::harness::{is_root, PgServer, REQUIRE};

pub struct Bouncer {
    dir: PathBuf,
    child: Child,
    pub port: u16,
}

fn found() -> bool {
    Command::new("sh")
        .args(["-c", "command -v pgbouncer || test -x /usr/sbin/pgbouncer"])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Bouncer {
    /// Starts PgBouncer in `mode` (`session`, `transaction`, `statement`) in front of `pg`, with
    /// `pool_size` server connections per database and user, or returns `None` (after reporting
    /// the test as not run) when pgbouncer is not installed and not required.
    #[allow(clippy::disallowed_methods)] // a deadline in wall time for a real process
    pub fn start(pg: &PgServer, mode: &str, pool_size: u32, test: &str) -> Option<Bouncer> {
        if crate::skip::hidden("pgbouncer") || !found() {
            crate::skip::skip("PgBouncer (Debian: apt-get install pgbouncer)", REQUIRE);
            return None;
        }
        let dir =
            std::env::temp_dir().join(format!("keyorder-pgbouncer-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let ini = dir.join("pgbouncer.ini");
        std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n").unwrap();
        std::fs::write(
            &ini,
            format!(
                "[databases]\n* = host=127.0.0.1 port={pg_port}\n\n[pgbouncer]\n\
                 listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = trust\nauth_file = {users}\npool_mode = {mode}\n\
                 default_pool_size = {pool_size}\nmax_client_conn = 500\n\
                 logfile = {log}\npidfile = {pid}\n",
                pg_port = pg.port,
                users = dir.join("users.txt").display(),
                log = dir.join("pgbouncer.log").display(),
                pid = dir.join("pgbouncer.pid").display(),
            ),
        )
        .unwrap();
        // PgBouncer refuses to run as root.
        let mut cmd = if is_root() {
            let ok = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir).status();
            assert!(ok.is_ok_and(|s| s.success()), "chown of the pgbouncer folder failed");
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", "pgbouncer"]);
            c
        } else {
            Command::new("pgbouncer")
        };
        let child = cmd
            .arg(&ini)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("pgbouncer starts");
        let bouncer = Bouncer { dir, child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "pgbouncer did not listen: {}", bouncer.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(bouncer)
    }

    /// A URL for database `db` through the pooler.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// PgBouncer's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        // runuser passes SIGTERM on to pgbouncer; the pid file names pgbouncer itself.
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("pgbouncer.pid")) {
            let _ = Command::new("kill").arg(pid.trim()).status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
