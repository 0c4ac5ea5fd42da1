//! Connection reuse and reply framing over plain HTTP, and how failures read.

use std::time::Duration;

use keyorder::deliver::{Deliver, DeliverError};
use keyorder::http::HttpOptions;
use keyorder::worker::chain;
use keyorder::PartitionId;

use super::server::{deliver, deliverer, head, hyper_server, raw, Canned};

const N: i64 = 5;

fn url(addr: std::net::SocketAddr) -> String {
    format!("http://{addr}/hook?x=1")
}

#[tokio::test]
async fn keep_alive_reuses_one_connection() {
    let (addr, counts, seen) = hyper_server(|_| (204, vec![])).await;
    let mut d = deliverer(&url(addr), HttpOptions::default());
    for n in 0..N {
        deliver(&mut d, n).await.expect("2xx");
    }
    assert_eq!(counts.requests(), N as usize);
    assert_eq!(counts.connections(), 1, "all deliveries on one kept-alive connection");
    let seen = seen.lock().unwrap();
    let first = &seen[0];
    assert_eq!(first.path, "/hook?x=1");
    assert_eq!(&first.body[..], br#"{"n": 0}"#);
    let h = |name: &str| first.headers[name].to_str().unwrap().to_owned();
    assert_eq!(h("content-type"), "application/json");
    assert_eq!(h("x-keyorder-event-id"), "evt-0");
    assert_eq!(h("webhook-id"), "evt-0");
    assert_eq!(h("x-keyorder-key"), "sub_1");
    assert_eq!(h("x-keyorder-seq"), "0");
    assert_eq!(h("x-keyorder-partition"), "3");
    assert_eq!(h("x-keyorder-attempt"), "1");
    assert_eq!(h("host"), addr.to_string());
    assert!(first.headers.get("webhook-signature").is_none(), "no secret, no signature");
    assert!(first.headers.get("webhook-timestamp").is_none());
}

#[tokio::test]
async fn an_http_1_0_server_closing_after_each_reply_costs_nothing_but_a_connection() {
    let reply = Canned::new("HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", true);
    let (addr, counts) = raw(vec![reply]).await;
    let mut d = deliverer(&url(addr), HttpOptions::default());
    for n in 0..N {
        deliver(&mut d, n).await.expect("2xx");
    }
    assert_eq!(counts.requests(), N as usize);
    assert_eq!(counts.connections(), N as usize, "one connection per reply");
}

#[tokio::test]
async fn connection_close_replies_reconnect_at_once() {
    let reply =
        Canned::new("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", true);
    let (addr, counts) = raw(vec![reply]).await;
    let mut d = deliverer(&url(addr), HttpOptions::default());
    for n in 0..N {
        deliver(&mut d, n).await.expect("2xx");
    }
    assert_eq!(counts.connections(), N as usize);
}

#[tokio::test]
async fn a_server_that_closes_silently_is_noticed_before_the_next_request() {
    // HTTP/1.1 without `Connection: close`, but the socket is closed after the reply.
    let reply = Canned::new("HTTP/1.1 204 No Content\r\n\r\n", true);
    let (addr, counts) = raw(vec![reply]).await;
    let mut d = deliverer(&url(addr), HttpOptions::default());
    for n in 0..N {
        deliver(&mut d, n).await.expect("2xx despite the silent close");
    }
    assert_eq!(counts.connections(), N as usize);
    assert_eq!(counts.requests(), N as usize, "nothing was sent twice");
}

#[tokio::test]
async fn chunked_replies_are_read_and_the_connection_kept() {
    let reply = Canned::new(
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        false,
    );
    let (addr, counts) = raw(vec![reply]).await;
    let mut d = deliverer(&url(addr), HttpOptions::default());
    for n in 0..N {
        deliver(&mut d, n).await.expect("2xx");
    }
    assert_eq!(counts.connections(), 1, "a chunked reply keeps the connection");
}

#[tokio::test]
async fn close_delimited_replies_without_length_succeed() {
    let reply = Canned::new("HTTP/1.1 200 OK\r\n\r\nthe body runs to the close", true);
    let (addr, counts) = raw(vec![reply]).await;
    let mut d = deliverer(&url(addr), HttpOptions::default());
    for n in 0..N {
        deliver(&mut d, n).await.expect("2xx");
    }
    assert_eq!(counts.connections(), N as usize);
}

#[tokio::test]
async fn redirects_fail_naming_status_and_location() {
    let (addr, _, _) =
        hyper_server(|_| (308, vec![("location", "https://new.example/hook")])).await;
    let mut d = deliverer(&url(addr), HttpOptions::default());
    let err = deliver(&mut d, 1).await.unwrap_err();
    assert!(matches!(err, DeliverError::Redirect { status: 308, .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("HTTP 308") && text.contains("https://new.example/hook"), "{text}");
    assert!(text.contains("not followed"), "{text}");
}

#[tokio::test]
async fn client_errors_fail_with_their_status() {
    let (addr, counts, _) = hyper_server(|_| (422, vec![])).await;
    let mut d = deliverer(&url(addr), HttpOptions::default());
    let err = deliver(&mut d, 1).await.unwrap_err();
    assert!(matches!(err, DeliverError::Status { status: 422, retry_after: None }), "{err:?}");
    assert_eq!(err.to_string(), "HTTP 422");
    assert!(!err.may_be_processing(), "an answer settles the attempt");
    deliver(&mut d, 2).await.unwrap_err();
    assert_eq!(counts.connections(), 1, "an error reply keeps the connection");
}

#[tokio::test]
async fn server_errors_keep_retry_after() {
    let (addr, _, _) = hyper_server(|_| (503, vec![("retry-after", "120")])).await;
    let mut d = deliverer(&url(addr), HttpOptions::default());
    let err = deliver(&mut d, 1).await.unwrap_err();
    assert!(matches!(err, DeliverError::Status { status: 503, .. }), "{err:?}");
    assert_eq!(err.retry_after(), Some(Duration::from_secs(120)));
}

#[tokio::test]
async fn a_reply_that_never_ends_times_out_and_the_next_call_starts_afresh() {
    // The first connection sends half a reply and stalls; later ones answer.
    let stall = Canned::new("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly a part", false);
    let ok = Canned::new("HTTP/1.1 204 No Content\r\n\r\n", false);
    let (addr, counts) = raw(vec![stall, ok]).await;
    let mut d = deliverer(&url(addr), HttpOptions::default());
    // As the worker does: its delivery timeout drops the call.
    let first = head(1);
    let cut =
        tokio::time::timeout(Duration::from_millis(300), d.deliver(PartitionId(0), &first, 1));
    assert!(cut.await.is_err(), "a reply that never ends does not complete");
    deliver(&mut d, 2).await.expect("the next call uses a new connection");
    assert_eq!(counts.connections(), 2);
}

#[tokio::test]
async fn a_reply_larger_than_the_limit_fails() {
    let mut big = b"HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\n".to_vec();
    big.extend(std::iter::repeat_n(b'x', 2000));
    let (addr, counts) = raw(vec![Canned::new(big, false)]).await;
    let options = HttpOptions { max_reply: 1024, ..HttpOptions::default() };
    let mut d = deliverer(&url(addr), options);
    let err = deliver(&mut d, 1).await.unwrap_err();
    assert!(matches!(err, DeliverError::ReplyTooLarge { status: 200, limit: 1024 }), "{err:?}");
    assert_eq!(err.to_string(), "HTTP 200 reply larger than 1 KiB (the limit)");
    deliver(&mut d, 2).await.unwrap_err();
    assert_eq!(counts.connections(), 2, "a cut-off reply's connection is not reused");
}

#[tokio::test]
async fn the_default_limit_is_one_mebibyte() {
    let mut big =
        format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", (1 << 20) + 1).into_bytes();
    big.extend(std::iter::repeat_n(b'x', (1 << 20) + 1));
    let mut fits = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", 1 << 20).into_bytes();
    fits.extend(std::iter::repeat_n(b'x', 1 << 20));
    let (addr, _) = raw(vec![Canned::new(fits, true), Canned::new(big, true)]).await;
    let mut d = deliverer(&url(addr), HttpOptions::default());
    deliver(&mut d, 1).await.expect("exactly 1 MiB is accepted");
    let err = deliver(&mut d, 2).await.unwrap_err();
    assert!(err.to_string().contains("reply larger than 1 MiB"), "{err}");
}

#[tokio::test]
async fn an_unreachable_host_names_host_and_port() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let mut d = deliverer(&url(addr), HttpOptions::default());
    let err = deliver(&mut d, 1).await.unwrap_err();
    assert!(matches!(err, DeliverError::Connect { .. }), "{err:?}");
    let text = chain(&err);
    assert!(text.starts_with(&format!("cannot connect to {addr}: ")), "{text}");
    assert!(text.to_lowercase().contains("refused"), "{text}");
    assert!(!err.may_be_processing(), "nothing was sent");
}
