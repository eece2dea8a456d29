//! Unit tests of the Redis store.

use super::*;

#[test]
fn passwords_never_reach_messages() {
    assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
    assert_eq!(redact("rediss://user:s3cr:et@h:1/0"), "rediss://user:***@h:1/0");
    assert_eq!(redact("redis://:pw@h:1?x=a@b"), "redis://:***@h:1?x=a@b");
    assert_eq!(redact("redis://user@h:1"), "redis://user@h:1");
    assert_eq!(redact("not a url"), "not a url");
}

#[tokio::test]
async fn tls_files_are_checked_before_connecting() {
    let settings = |url: &str, tls: RedisTls| RedisSettings {
        url: url.to_string(),
        timeout: Duration::from_millis(100),
        pool_size: 1,
        server_time: true,
        tls,
    };
    let ca = RedisTls {
        ca: Some("/nonexistent/ca.pem".into()),
        ..RedisTls::default()
    };
    let e = RedisStore::connect(&settings("redis://u:pw@127.0.0.1:1", ca.clone()))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("need a TLS url") && e.contains("u:***@") && !e.contains("pw"),
        "{e}"
    );
    let e = RedisStore::connect(&settings("rediss://127.0.0.1:1", ca))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("redis tls ca '/nonexistent/ca.pem'"), "{e}");
    let half = RedisTls {
        cert: Some("c.pem".into()),
        ..RedisTls::default()
    };
    let e = RedisStore::connect(&settings("rediss://127.0.0.1:1", half))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("needs its key"), "{e}");
}
