//! A small plain-HTTP/1.1 server of read-only pages (the worker's `/metrics` and `/healthz`),
//! so that code outside `src/http/` serves pages without naming hyper.
//!
//! What it guarantees: connections served side by side on the calling thread (a slow page,
//! such as a lag query over a deep queue, does not hold up a health check), no keep-alive,
//! every connection bounded by [`CONNECTION_TIMEOUT`]; the request's path (without its query)
//! is handed to the page function and its [`Page`] is the reply, whatever the method. A
//! connection that fails is dropped; the loop ends only with its runtime.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::CONTENT_TYPE;
use hyper::service::service_fn;
use hyper::Response;
use hyper_util::rt::TokioIo;

/// How long one connection may take, request and reply, before it is dropped.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// One reply: a status code, a content type and a body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page {
    /// The HTTP status code (an invalid one is answered as 500).
    pub status: u16,
    /// The `Content-Type` header (left out when it is not a valid header value).
    pub content_type: &'static str,
    /// The body.
    pub body: String,
}

impl Page {
    /// A page of `status` with a `text/plain` body.
    pub fn text(status: u16, body: impl Into<String>) -> Self {
        Page { status, content_type: "text/plain; charset=utf-8", body: body.into() }
    }
}

/// Serves `listener` until the runtime ends: each request's path goes to `page`, whose
/// answer is the reply. Each connection is a task of the current `LocalSet` (this must run
/// inside one), so `page` may hold state that is not `Send` or `Sync`, and one slow answer
/// does not delay the others.
pub async fn serve_pages<F, Fut>(listener: tokio::net::TcpListener, page: F)
where
    F: Fn(String) -> Fut + Clone + 'static,
    Fut: Future<Output = Page> + 'static,
{
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let page = page.clone();
        let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let answer = page(req.uri().path().to_owned());
            async move { Ok::<_, std::convert::Infallible>(reply(answer.await)) }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .keep_alive(false)
            .serve_connection(TokioIo::new(stream), service);
        tokio::task::spawn_local(async move {
            let _ = tokio::time::timeout(CONNECTION_TIMEOUT, conn).await;
        });
    }
}

fn reply(page: Page) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(page.body)));
    *r.status_mut() = hyper::StatusCode::from_u16(page.status)
        .unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = page.content_type.parse() {
        r.headers_mut().insert(CONTENT_TYPE, v);
    }
    r
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// Sends one raw request for `path` and returns the whole reply.
    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path}?x=1 HTTP/1.1\r\nHost: t\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).await.unwrap();
        reply
    }

    #[tokio::test]
    async fn each_path_gets_its_page_and_a_bad_status_is_500() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let pages = |path: String| async move {
            match path.as_str() {
                "/a" => Page { status: 201, content_type: "text/x-a", body: "page a".into() },
                "/bad" => Page::text(1000, "nope"),
                _ => Page::text(404, format!("no {path}")),
            }
        };
        let server = tokio::task::LocalSet::new();
        server
            .run_until(async move {
                tokio::task::spawn_local(serve_pages(listener, pages));
                let a = get(addr, "/a").await;
                assert!(a.starts_with("HTTP/1.1 201"), "{a}");
                assert!(a.contains("content-type: text/x-a"), "{a}");
                assert!(a.ends_with("page a"), "{a}");
                let missing = get(addr, "/elsewhere").await;
                assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
                assert!(
                    missing.ends_with("no /elsewhere"),
                    "the path without its query: {missing}"
                );
                let bad = get(addr, "/bad").await;
                assert!(bad.starts_with("HTTP/1.1 500"), "{bad}");
            })
            .await;
    }

    /// A page that never answers (a lag query over a deep queue) does not hold up the next
    /// request: served one at a time, the quick page would wait the whole connection timeout.
    #[tokio::test]
    async fn a_slow_page_does_not_hold_up_another() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let pages = |path: String| async move {
            if path == "/slow" {
                std::future::pending::<()>().await;
            }
            Page::text(200, "quick")
        };
        let server = tokio::task::LocalSet::new();
        server
            .run_until(async move {
                tokio::task::spawn_local(serve_pages(listener, pages));
                // The slow request is connected and sent first, so it is accepted first.
                let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
                slow.write_all(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n").await.unwrap();
                let quick = tokio::time::timeout(Duration::from_secs(3), get(addr, "/quick"))
                    .await
                    .expect("the quick page waited for the slow one");
                assert!(quick.ends_with("quick"), "{quick}");
                let unanswered = slow.try_read(&mut [0u8; 1]);
                assert!(
                    matches!(&unanswered, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
                    "the slow page is still being worked on: {unanswered:?}"
                );
            })
            .await;
    }
}
