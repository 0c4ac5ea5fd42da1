//! `keyorder work --metrics-addr` on PostgreSQL: `/healthz` answers 503 while the server is
//! stopped and 200 again after it returns.

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::endpoint::Endpoint;
use super::harness::PgServer;

fn status(port: u16, path: &str) -> Option<u16> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.split_whitespace().nth(1)?.parse().ok()
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[allow(clippy::disallowed_methods)] // a real-time test of a real process
fn wait_for(port: u16, want: u16, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    loop {
        let got = status(port, "/healthz");
        if got == Some(want) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: /healthz answered {got:?}, not {want}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
#[allow(clippy::disallowed_methods)] // a real-time test of a real process
fn healthz_is_503_while_the_store_is_down_and_200_after_it_returns() {
    let Some(pg) = PgServer::start() else { return };
    let url = pg.create_db("metrics_healthz");
    let migrate = Command::new(env!("CARGO_BIN_EXE_keyorder"))
        .args(["migrate", "--database", &url])
        .output()
        .expect("keyorder migrate");
    assert!(migrate.status.success(), "{}", String::from_utf8_lossy(&migrate.stderr));
    let endpoint = Endpoint::start(Instant::now());
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let worker = Command::new(env!("CARGO_BIN_EXE_keyorder"))
        .args(["work", "--database", &url, "--deliver", &endpoint.url, "--threads", "1"])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}"), "--stop-after", "120"])
        .args(["--request-timeout-ms", "1000", "--delivery-timeout-ms", "1000"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("keyorder work starts");
    let _worker = Kill(worker);
    wait_for(port, 200, Duration::from_secs(30), "after start");
    pg.stop_immediate();
    wait_for(port, 503, Duration::from_secs(15), "with the server stopped");
    pg.start_again();
    wait_for(port, 200, Duration::from_secs(30), "after the server returned");
}
