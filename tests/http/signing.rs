//! A real signed request, captured by an in-process receiver, verified by an independent
//! Python implementation of the Standard Webhooks scheme (standard library only).

use std::process::Command;

use keyorder::http::{HttpOptions, Signing, SigningKey, SigningKeys};

use super::server::{deliver, deliverer, hyper_server};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// Exits 0 if argv = secret id timestamp body signature verifies, 1 otherwise.
const VERIFY: &str = r#"
import base64, hashlib, hmac, sys
secret, msg_id, timestamp, body, header = sys.argv[1:6]
key = base64.b64decode(secret[len("whsec_"):]) if secret.startswith("whsec_") else secret.encode()
signed = f"{msg_id}.{timestamp}.".encode() + body.encode()
expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
ok = any(s.split(",", 1) == ["v1", expected] for s in header.split(" "))
sys.exit(0 if ok else 1)
"#;

fn python_verifies(id: &str, timestamp: &str, body: &str, signature: &str) -> bool {
    let status = Command::new("python3")
        .args(["-c", VERIFY, SECRET, id, timestamp, body, signature])
        .status()
        .expect("python3 runs (it verifies signatures independently)");
    status.success()
}

fn fixed_time() -> u64 {
    1_700_000_000
}

#[tokio::test]
async fn signed_requests_verify_independently_and_tampering_is_caught() {
    let (addr, _, seen) = hyper_server(|_| (204, vec![])).await;
    let signing =
        Signing { keys: SigningKey::from_secret(SECRET).unwrap().into(), unix_time: fixed_time };
    let options = HttpOptions { signing: Some(signing), ..HttpOptions::default() };
    let mut d = deliverer(&format!("http://{addr}/"), options);
    deliver(&mut d, 42).await.expect("2xx");
    let captured = seen.lock().unwrap()[0].clone();
    let h = |name: &str| captured.headers[name].to_str().unwrap().to_owned();
    let (id, timestamp, signature) =
        (h("webhook-id"), h("webhook-timestamp"), h("webhook-signature"));
    let body = std::str::from_utf8(&captured.body).unwrap();
    assert_eq!((id.as_str(), timestamp.as_str(), body), ("evt-42", "1700000000", r#"{"n": 42}"#));
    assert!(signature.starts_with("v1,"), "{signature}");
    assert!(python_verifies(&id, &timestamp, body, &signature), "the signature verifies");
    assert!(!python_verifies(&id, &timestamp, r#"{"n": 43}"#, &signature), "a tampered body fails");
    assert!(!python_verifies("evt-43", &timestamp, body, &signature), "another id fails");
    assert!(!python_verifies(&id, "1700000001", body, &signature), "another timestamp fails");
}

/// Rotation: a request signed with the new and the old secret (newest first, one `v1,` each,
/// space-separated) verifies for a receiver holding only the old secret, and for one holding
/// only the new one; a receiver with a third secret rejects it.
#[tokio::test]
async fn during_a_rotation_either_secret_verifies_independently() {
    const NEW: &str = "whsec_QmV0dGVyIHJvdGF0ZSB0aGlzIG9uZSB0b28=";
    const THIRD: &str = "whsec_c29tZSBvdGhlciB0ZW5hbnQ=";
    let (addr, _, seen) = hyper_server(|_| (204, vec![])).await;
    let keys = SigningKeys::from_lines(&format!("{NEW}\n{SECRET}\n")).unwrap();
    let signing = Signing { keys, unix_time: fixed_time };
    let options = HttpOptions { signing: Some(signing), ..HttpOptions::default() };
    let mut d = deliverer(&format!("http://{addr}/"), options);
    deliver(&mut d, 7).await.expect("2xx");
    let captured = seen.lock().unwrap()[0].clone();
    let headers = captured.headers.get_all("webhook-signature").iter().count();
    assert_eq!(headers, 1, "one webhook-signature header");
    let h = |name: &str| captured.headers[name].to_str().unwrap().to_owned();
    let (id, timestamp, signature) =
        (h("webhook-id"), h("webhook-timestamp"), h("webhook-signature"));
    let body = std::str::from_utf8(&captured.body).unwrap();
    let parts: Vec<&str> = signature.split(' ').collect();
    assert_eq!(parts.len(), 2, "{signature}");
    assert!(parts.iter().all(|p| p.starts_with("v1,")), "{signature}");
    let verifies = |secret: &str, sig: &str| {
        Command::new("python3")
            .args(["-c", VERIFY, secret, &id, &timestamp, body, sig])
            .status()
            .expect("python3 runs")
            .success()
    };
    assert!(verifies(SECRET, &signature), "a receiver with only the old secret accepts");
    assert!(verifies(NEW, &signature), "a receiver with only the new secret accepts");
    assert!(!verifies(THIRD, &signature), "a receiver with another secret rejects");
    assert!(verifies(NEW, parts[0]) && !verifies(SECRET, parts[0]), "the newest comes first");
}
