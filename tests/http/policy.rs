//! The address policy on real sockets: a deliverer with a policy makes no connection at all to
//! a refused address (the listener sees nothing), resolves a name once and checks what it
//! resolved to, connects to an allowed address with keep-alive reuse intact, and a deliverer
//! without a policy (the operator's --deliver) is not checked.

use keyorder::address_policy::AddressPolicy;
use keyorder::deliver::DeliverError;
use keyorder::http::HttpOptions;

use super::server::{deliver, deliverer, hyper_server};

fn with(policy: AddressPolicy) -> HttpOptions {
    HttpOptions { policy: Some(policy), ..HttpOptions::default() }
}

#[tokio::test]
async fn a_refused_address_gets_no_connection_and_the_error_names_address_and_rule() {
    let (addr, counts, _) = hyper_server(|_| (204, vec![])).await;
    let port = addr.port();
    for (url, ip, range) in [
        (format!("http://127.0.0.1:{port}/"), "127.0.0.1", "127.0.0.0/8"),
        (format!("http://2130706433:{port}/"), "127.0.0.1", "127.0.0.0/8"),
        (format!("http://0x7f.1:{port}/"), "127.0.0.1", "127.0.0.0/8"),
        (format!("http://localhost:{port}/"), "127.0.0.1", "127.0.0.0/8"),
        (format!("http://[::ffff:127.0.0.1]:{port}/"), "127.0.0.1", "127.0.0.0/8"),
        (format!("http://[::1]:{port}/"), "::1", "::1/128"),
    ] {
        let mut d = deliverer(&url, with(AddressPolicy::default()));
        let err = deliver(&mut d, 1).await.unwrap_err();
        let text = err.to_string();
        match &err {
            DeliverError::Refused { ip: refused, rule, .. } => {
                assert_eq!((refused.to_string().as_str(), rule.range()), (ip, range), "{url}");
            }
            other => panic!("{url}: not refused by the policy: {other}"),
        }
        assert!(text.contains("address policy") && text.contains(ip), "{url}: {text}");
        assert!(!err.may_be_processing(), "nothing was sent");
    }
    assert_eq!(counts.connections(), 0, "no refused address was connected to");
}

#[tokio::test]
async fn allowed_addresses_connect_once_and_reuse_the_connection() {
    let (addr, counts, seen) = hyper_server(|_| (204, vec![])).await;
    let port = addr.port();
    let loopback = AddressPolicy::new(vec!["127.0.0.0/8".parse().unwrap()]);
    let mut d = deliverer(&format!("http://localhost:{port}/a"), with(loopback));
    for n in 0..3 {
        deliver(&mut d, n).await.expect("2xx: 127.0.0.0/8 is allowed");
    }
    assert_eq!(counts.connections(), 1, "three deliveries on one kept-alive connection");
    let host = seen.lock().unwrap()[0].headers["host"].to_str().unwrap().to_owned();
    assert_eq!(host, format!("localhost:{port}"), "the Host header keeps the name");
    let mut open =
        deliverer(&format!("http://[::ffff:127.0.0.1]:{port}/"), with(AddressPolicy::allow_all()));
    deliver(&mut open, 4).await.expect("2xx: everything allowed");
    let mut trusted = deliverer(&format!("http://2130706433:{port}/"), HttpOptions::default());
    deliver(&mut trusted, 5).await.expect("2xx: no policy, as --deliver");
    assert_eq!(counts.requests(), 5);
}
