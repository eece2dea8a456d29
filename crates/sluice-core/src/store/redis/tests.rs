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

/// How many times the server ran `command` (`INFO commandstats`, e.g. `script|load`).
fn runs(redis: &sluice_testkit::RedisServer, command: &str) -> u64 {
    let stats = redis.cli(&["--raw", "INFO", "commandstats"]);
    let line = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&line))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Every request in flight when the server lost its scripts meets the decision script missing; it is loaded once for
/// all of them, and each is decided once it is: as a function (FUNCTION LOAD), or by EVALSHA (SCRIPT LOAD) for a user
/// the server refuses functions.
#[tokio::test]
async fn requests_that_meet_the_script_missing_together_load_it_once() {
    let redis = sluice_testkit::RedisServer::start();
    // The documented user without what functions need: the server refuses them, and the store turns to EVALSHA.
    let mut rules: Vec<String> = sluice_testkit::readme_acl_user("test:")
        .into_iter()
        .filter(|r| r != "+fcall" && r != "+function|load")
        .collect();
    rules[0] = "old".into();
    let mut setuser = vec!["ACL", "SETUSER"];
    setuser.extend(rules.iter().map(String::as_str));
    assert_eq!(redis.cli(&setuser).trim(), "OK");
    let refused = format!("redis://old:{}@127.0.0.1:{}", sluice_testkit::ACL_PASSWORD, redis.port);
    for (url, load, call) in [
        (redis.url(), "function|load", "fcall"),
        (refused, "script|load", "evalsha"),
    ] {
        let store = RedisStore::connect(&RedisSettings {
            url,
            timeout: Duration::from_secs(2),
            pool_size: 2,
            server_time: true,
            tls: RedisTls::default(),
        })
        .await
        .unwrap();
        let hit = |i: usize| {
            let key = CounterKey::builder("test:", call).entry("k", &i.to_string()).finish();
            super::call::tests::fixed_window_hit(&key)
        };
        for round in 0..3 {
            redis.flush_scripts();
            assert_eq!(redis.cli(&["CONFIG", "RESETSTAT"]).trim(), "OK");
            let requests = (0..64).map(|i| {
                let store = store.clone();
                let hits = vec![hit(i)];
                tokio::spawn(async move { store.hit(0, &hits).await })
            });
            for answer in futures::future::join_all(requests).await {
                let answer = answer.unwrap().pop().unwrap().unwrap();
                assert!(
                    answer.admitted && answer.tiers[0].used == round + 1,
                    "{call}: {answer:?}"
                );
            }
            assert_eq!(runs(&redis, load), 1, "{call}, round {round}");
            assert!(runs(&redis, call) >= 2, "{call}, round {round}: decided by {call}");
        }
    }
}
