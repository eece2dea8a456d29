//! Unit tests of the Redis store.

use super::settings::redact;
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

/// A store on `url` with `pool_size` connections, decided by the server's clock.
async fn connect(url: String, pool_size: usize) -> RedisStore {
    RedisStore::connect(&RedisSettings {
        url,
        timeout: Duration::from_secs(2),
        pool_size,
        server_time: true,
        tls: RedisTls::default(),
    })
    .await
    .unwrap()
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
    let refused = sluice_testkit::user_without_functions(&redis, "old", "test:");
    for (url, load, call) in [
        (redis.url(), "function|load", "fcall"),
        (refused, "script|load", "evalsha"),
    ] {
        let store = connect(url, 2).await;
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

/// A server that refuses functions turns the store to EVALSHA, not for good: once the user is granted `fcall` and
/// `function|load`, the store's next try of functions (a minute after the refusal; here when the test says) loads the library,
/// and calls go by FCALL again, with no call failed on the way.
#[tokio::test]
async fn functions_granted_later_are_used_without_a_restart() {
    let redis = sluice_testkit::RedisServer::start();
    let store = connect(sluice_testkit::user_without_functions(&redis, "late", "test:"), 1).await;
    let key = CounterKey::builder("test:", "late").entry("k", "v").finish();
    let hit = super::call::tests::fixed_window_hit(&key);
    let used = |answers: Answers| answers.into_iter().next().unwrap().unwrap().tiers[0].used;
    assert_eq!(used(store.hit(0, std::slice::from_ref(&hit)).await), 1);
    assert_eq!(
        (runs(&redis, "fcall"), runs(&redis, "evalsha")),
        (0, 1),
        "refused: by EVALSHA"
    );
    // Within the minute, EVALSHA alone.
    assert_eq!(used(store.hit(0, std::slice::from_ref(&hit)).await), 2);
    assert_eq!(runs(&redis, "function|load"), 0);
    // Still refused when tried again: the call is decided by EVALSHA after the refusal, and none fails.
    store.script.try_functions_again();
    assert_eq!(used(store.hit(0, std::slice::from_ref(&hit)).await), 3);
    assert_eq!(runs(&redis, "evalsha"), 3);
    // Granted: the next try loads the library, and calls go by FCALL.
    assert_eq!(
        redis
            .cli(&["ACL", "SETUSER", "late", "+fcall", "+function|load"])
            .trim(),
        "OK"
    );
    assert_eq!(redis.cli(&["CONFIG", "RESETSTAT"]).trim(), "OK");
    store.script.try_functions_again();
    for n in 4..=6 {
        assert_eq!(used(store.hit(0, std::slice::from_ref(&hit)).await), n);
    }
    assert_eq!(runs(&redis, "function|load"), 1);
    assert!(runs(&redis, "fcall") >= 3, "by FCALL once granted");
    assert_eq!(runs(&redis, "evalsha"), 0);
}

/// A user allowed to load functions but not to call them (`function|load` without `fcall`): the first refused FCALL
/// turns the store to EVALSHA, and no call fails, then or after.
#[tokio::test]
async fn a_user_refused_fcall_alone_is_served_by_evalsha() {
    let redis = sluice_testkit::RedisServer::start();
    let url = sluice_testkit::user_without_functions(&redis, "half", "test:");
    assert_eq!(redis.cli(&["ACL", "SETUSER", "half", "+function|load"]).trim(), "OK");
    let store = connect(url, 1).await;
    let key = CounterKey::builder("test:", "half").entry("k", "v").finish();
    let hit = super::call::tests::fixed_window_hit(&key);
    for n in 1..=3 {
        let answer = store.hit(0, std::slice::from_ref(&hit)).await.pop().unwrap();
        assert_eq!(answer.expect("decided").tiers[0].used, n);
    }
    assert_eq!(runs(&redis, "evalsha"), 3, "every call decided by EVALSHA");
    // A minute later functions are tried again: still refused, and the call is decided all the same.
    store.script.try_functions_again();
    let answer = store.hit(0, std::slice::from_ref(&hit)).await.pop().unwrap();
    assert_eq!(answer.expect("decided").tiers[0].used, 4);
}
