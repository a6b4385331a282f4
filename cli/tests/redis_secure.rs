//! Routing through a Redis that a platform team would run: a password, TLS with the team's own
//! CA, client certificates. Real `redis-server` processes (Debian's build has TLS), certificates
//! made per test (`scripts/test/tls_certs.sh`), the real worker and router processes.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// The router's index becomes `want` within `secs`.
fn wait_index(router: &Proc, want: &str, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while debug_routing(router)["index"] != want {
        assert!(Instant::now() < deadline, "the router's index never became {want}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn router(redis_flags: &[String], d: &Proc, p: &Proc) -> Proc {
    let mut a: Vec<String> =
        vec!["router".into(), "--listen=127.0.0.1:0".into(), "--model".into(), model()];
    a.extend(redis_flags.iter().cloned());
    a.push(format!("--decode-workers={}", d.addr));
    a.push(format!("--prefill-workers={}", p.addr));
    Proc::start("router", &a, &[])
}

#[test]
fn routing_through_redis_with_password_tls_and_client_certificates_survives_a_restart() {
    let certs = tls_certs("redis-mtls");
    let opts = RedisOptions {
        password: Some("s3cret".into()),
        tls: Some(certs.clone()),
        client_certs: true,
    };
    let mut redis = RedisServer::start_with(None, opts);
    assert!(redis.url.starts_with("rediss://:s3cret@"), "{}", redis.url);
    let f = |name: &str| certs.join(name).display().to_string();
    let flags = vec![
        format!("--redis-url={}", redis.url),
        format!("--redis-ca-cert={}", f("ca.pem")),
        format!("--redis-client-cert={}", f("client.pem")),
        format!("--redis-client-key={}", f("client.key")),
    ];
    let refs: Vec<&str> = flags.iter().map(String::as_str).collect();
    // The prefill worker takes the password apart from the URL, as from a Kubernetes Secret.
    let bare = format!("--redis-url={}", redis.url.replace(":s3cret@", ""));
    let p = prefill(
        &[&[bare.as_str()], &refs[1..], &["--worker-id=prefill-0"]].concat(),
        &[("TANDEM_REDIS_PASSWORD", "s3cret")],
    );
    let d = decode(&[&refs[..], &["--worker-id=decode-0", "--disagg-min-tokens=1"]].concat(), &[]);
    let r = router(&flags, &d, &p);
    // Connected over TLS with the password: the router reads the workers' events.
    wait_index(&r, "exact", 15);
    complete(&r, &format!("{}Tell me about TLS.", long_prompt()));
    wait_indexed(&[&r], "prefill-0", 1);
    assert!(metric_sum(&p.addr, "tandem_kv_events_published_total") >= 1.0);

    // Redis restarts: requests keep being served, and the exact index comes back.
    redis.stop();
    wait_index(&r, "approximate", 15);
    complete(&r, "While Redis is away,");
    redis.restart();
    wait_index(&r, "exact", 20);
    complete(&r, &format!("{}After the restart.", long_prompt()));
    let published = metric_sum(&p.addr, "tandem_kv_events_published_total");
    let deadline = Instant::now() + Duration::from_secs(10);
    // The prefill worker reconnects on its own and publishes again.
    for i in 0.. {
        // A new prompt from its first token: new blocks, so new events.
        complete(&r, &format!("Attempt {i}. {}", long_prompt()));
        if metric_sum(&p.addr, "tandem_kv_events_published_total") > published {
            break;
        }
        assert!(Instant::now() < deadline, "the prefill worker never published again");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn wrong_password_or_untrusted_server_degrades_and_bad_settings_stop_at_start() {
    let certs = tls_certs("redis-tls");
    let other = tls_certs("redis-tls-other-ca");
    let opts = RedisOptions {
        password: Some("right".into()),
        tls: Some(certs.clone()),
        ..Default::default()
    };
    let redis = RedisServer::start_with(None, opts);
    let ca = |dir: &std::path::Path| format!("--redis-ca-cert={}", dir.join("ca.pem").display());
    let wrong_url = redis.url.replace(":right@", ":wrong@");
    let wrong_pw = [format!("--redis-url={wrong_url}"), ca(&certs)];
    let untrusted = [format!("--redis-url={}", redis.url), ca(&other)];
    let p = prefill(&["--worker-id=prefill-0", &wrong_pw[0], &wrong_pw[1]], &[]);
    let d = decode(&["--worker-id=decode-0"], &[]);
    for flags in [wrong_pw.to_vec(), untrusted.to_vec()] {
        let r = router(&flags, &d, &p);
        // It never gets onto Redis, yet every request is served (approximate index).
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(debug_routing(&r)["index"], "approximate", "{flags:?}");
        assert_eq!(metric(&r.addr, "tandem_router_redis_up", &[]), Some(0.0));
        complete(&r, &format!("{}Served without Redis.", long_prompt()));
    }
    // The worker with the wrong password counts its events as dropped.
    assert!(metric_sum(&p.addr, "tandem_kv_events_dropped_total") >= 1.0);
    assert_eq!(metric_sum(&p.addr, "tandem_kv_events_published_total"), 0.0);

    // Settings that can never work stop the process at start-up, saying why.
    let bin = env!("CARGO_BIN_EXE_tandem");
    for (flags, says) in [
        (vec!["--redis-url=http://127.0.0.1:1".to_string()], "expected redis:// or rediss://"),
        (vec!["--redis-url=redis://127.0.0.1:1".into(), ca(&certs)], "the URL is not rediss://"),
        (
            vec![
                "--redis-url=rediss://:pw@127.0.0.1:1".into(),
                "--redis-ca-cert=/nonexistent.pem".into(),
            ],
            "/nonexistent.pem",
        ),
    ] {
        let out = std::process::Command::new(bin)
            .args(["router", "--listen=127.0.0.1:0", "--model", &model()])
            .arg(format!("--decode-workers={}", d.addr))
            .args(&flags)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?} started");
        assert!(err.contains(says), "{flags:?}: {err}");
        assert!(!err.contains(":pw@"), "the password is printed: {err}");
    }
}
