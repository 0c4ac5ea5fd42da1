//! The producer's connection commits durably by default: `synchronous = FULL` (2) on the admin
//! connection that `keyorder enqueue` opens, NORMAL (1) only when asked; the worker's
//! connections stay NORMAL (a lost acknowledgement is a duplicate, never a loss).

use keyorder::store::admin::{Admin, Durability};
use keyorder::store::open::{Location, OpenMode};
use keyorder::store::sqlite::schema;

use super::cli::{keyorder, TempDir};

/// `PRAGMA synchronous` of a raw connection: 0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA.
fn synchronous(conn: &rusqlite::Connection) -> i64 {
    conn.query_row("PRAGMA synchronous", [], |r| r.get(0)).expect("reads the pragma")
}

fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(fut)
}

#[test]
fn the_producing_connection_is_full_by_default_and_normal_only_when_asked() {
    let dir = TempDir::new("durability");
    let file = dir.path("q.db");
    let location = Location::parse(&format!("sqlite:{}", file.display())).expect("parses");
    block_on(async {
        // As `keyorder enqueue` opens it, before any --durability is applied.
        let mut admin = location.open_admin(OpenMode::Create).await.expect("opens");
        assert_eq!(admin.durability().expect("reads"), Some(Durability::Full));
        // `--durability full` (the flag's default) keeps it FULL.
        admin.set_durability(Durability::Full).expect("sets");
        assert_eq!(admin.durability().expect("reads"), Some(Durability::Full));
        admin.set_durability(Durability::Normal).expect("sets");
        assert_eq!(admin.durability().expect("reads"), Some(Durability::Normal));
        // A connection opened afterwards is FULL again: the setting is per connection.
        let again = location.open_admin(OpenMode::Existing).await.expect("opens");
        assert_eq!(again.durability().expect("reads"), Some(Durability::Full));
    });
    // The worker's connection (schema::open, as SqliteStore opens it) stays NORMAL.
    let worker = schema::open(&file, schema::OpenMode::Existing).expect("opens");
    assert_eq!(synchronous(&worker), 1, "the worker's connection is synchronous=NORMAL");
}

#[test]
fn enqueue_accepts_full_and_normal_and_refuses_anything_else() {
    let dir = TempDir::new("durability-cli");
    let db = format!("sqlite:{}", dir.path("q.db").display());
    let events = dir.path("events.jsonl");
    std::fs::write(
        &events,
        "{\"event_id\":\"e1\",\"subscription_id\":\"s\",\"tenant_id\":\"t\",\"resource_id\":\"r\",\"payload\":{}}\n\
         {\"event_id\":\"e2\",\"subscription_id\":\"s\",\"tenant_id\":\"t\",\"resource_id\":\"r\",\"payload\":{}}\n",
    )
    .expect("writes events");
    let ev = events.to_str().expect("utf-8 path");
    let out = keyorder(&dir.0, &["enqueue", "--database", &db, ev]);
    assert!(out.status.success(), "default: {}", String::from_utf8_lossy(&out.stderr));
    let out = keyorder(&dir.0, &["enqueue", "--database", &db, "--durability", "normal", ev]);
    assert!(out.status.success(), "normal: {}", String::from_utf8_lossy(&out.stderr));
    let out = keyorder(&dir.0, &["enqueue", "--database", &db, "--durability", "off", ev]);
    assert_eq!(out.status.code(), Some(2), "an unknown durability is bad input");
}
