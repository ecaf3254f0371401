//! Settings from the environment with the family's names (issue 50, item 4): every variable
//! read into its field and its option, every refusal naming its variable and the forms it
//! takes, the duration forms, secrets out of `Debug` and errors, a TOML file under the
//! environment, and a connection made from the settings alone on the real broker. No test sets
//! a process variable (they run in parallel): the variables are given as pairs.

mod support;

use std::time::Duration;

use acemq_amqp::settings::{RetryKind, Settings};
use acemq_amqp::{ConnectionOptions, ConsumerOptions, PublisherOptions, RetryPolicy};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// The settings of `vars`, after an `ACEMQ_URL` of the test's own.
fn with(vars: &[(&str, &str)]) -> acemq_amqp::Result<Settings> {
    let mut all = vec![("ACEMQ_URL", "amqp://rabbit.internal/")];
    all.extend_from_slice(vars);
    Settings::from_vars(all)
}

/// The refusal of `vars`, as text.
fn refusal(vars: &[(&str, &str)]) -> String {
    match with(vars) {
        Ok(s) => panic!("{vars:?} was read: {s:?}"),
        Err(e) => {
            assert!(
                matches!(e, acemq_amqp::Error::InvalidArgument { .. }),
                "{vars:?}: {e:?}"
            );
            e.to_string()
        }
    }
}

#[test]
fn the_defaults_are_the_librarys_and_the_familys_drain() {
    let s = Settings::default();
    assert_eq!(s.urls, ["amqp://localhost:5672/"]);
    let ours = format!("{:?}", s.connection_options().unwrap());
    let library = format!(
        "{:?}",
        ConnectionOptions::new().address("amqp://localhost:5672/")
    );
    assert_eq!(ours, library);
    assert_eq!(
        format!("{:?}", s.publisher_options()),
        format!("{:?}", PublisherOptions::new())
    );
    // The one default that is the family's, not ConsumerOptions' 30 s: the drain.
    assert_eq!(s.drain_timeout(), secs(20));
    assert_eq!(
        format!("{:?}", s.consumer_options()),
        format!("{:?}", ConsumerOptions::new().shutdown_timeout(secs(20)))
    );
    assert_eq!(s.retry_policy(), None);
    assert_eq!(
        Settings::from_vars(Vec::<(String, String)>::new()).unwrap(),
        s
    );
}

#[test]
fn every_variable_of_the_connection_and_publishing_is_read_into_its_option() {
    let s = Settings::from_vars([
        ("ACEMQ_URL", "amqp://a:pa@h1:5673/x, amqp://h2/"),
        ("ACEMQ_USERNAME", "billing"),
        ("ACEMQ_PASSWORD", "pw"),
        ("ACEMQ_VIRTUAL_HOST", "tenant/a"),
        ("ACEMQ_CLIENT_NAME", "billing-service"),
        ("ACEMQ_CONNECTION_TIMEOUT", "7"),
        ("ACEMQ_HEARTBEAT", "PT25S"),
        ("ACEMQ_CONFIRM_TIMEOUT", "12s"),
        ("ACEMQ_MAX_OUTSTANDING_PUBLISHES", "500"),
        ("ACEMQ_PUBLISHER_CONFIRMS", "false"),
        ("ACEMQ_FORMAT", "text"),
        ("ACEMQ_CHANNEL_MAX", "64"),
        ("ACEMQ_FRAME_MAX", "65536"),
        ("ACEMQ_BACKOFF_MIN", "250ms"),
        ("ACEMQ_BACKOFF_MAX", "0:00:20"),
        ("ACEMQ_OPERATION_TIMEOUT", "45"),
        ("ACEMQ_MAX_UNCONFIRMED_BYTES", "1048576"),
        ("PATH", "/usr/bin"), // not ours: skipped
    ])
    .unwrap();
    assert_eq!(s.urls, ["amqp://a:pa@h1:5673/x", "amqp://h2/"]);
    assert_eq!(s.username.as_deref(), Some("billing"));
    assert_eq!(s.password.as_ref().map(|p| p.expose()), Some("pw"));
    assert_eq!(s.virtual_host.as_deref(), Some("tenant/a"));
    assert_eq!(s.client_name.as_deref(), Some("billing-service"));
    assert_eq!(s.connection_timeout, secs(7));
    assert_eq!(s.heartbeat, secs(25));
    assert_eq!(s.confirm_timeout, secs(12));
    assert_eq!(s.max_outstanding_publishes, 500);
    assert!(!s.publisher_confirms);
    assert_eq!(s.format, "text");
    assert_eq!(s.channel_max, 64);
    assert_eq!(s.frame_max, 65536);
    assert_eq!(s.backoff_min, Duration::from_millis(250));
    assert_eq!(s.backoff_max, secs(20));
    assert_eq!(s.operation_timeout, secs(45));
    assert_eq!(s.max_unconfirmed_bytes, 1 << 20);

    let options = format!("{:?}", s.connection_options().unwrap());
    for part in [
        // The vhost replaces each URL's, encoded whole; the URL's password is not shown.
        r#"addresses: ["amqp://a@h1:5673/tenant%2fa", "amqp://guest@h2:5672/tenant%2fa"]"#,
        "heartbeat: 25s",
        "connect_timeout: 7s",
        "channel_max: 64",
        "frame_max: 65536",
        "backoff_min: 250ms",
        "backoff_max: 20s",
        "operation_timeout: 45s",
        r#"name: Some("billing-service")"#,
        r#"service: "billing-service""#,
        "TextCodec",
        r#"credentials: Some("<source>")"#,
    ] {
        assert!(options.contains(part), "{part} not in {options}");
    }
    let publisher = format!("{:?}", s.publisher_options());
    let expected = format!(
        "{:?}",
        PublisherOptions::new()
            .window(500)
            .timeout(secs(12))
            .confirms(false)
    );
    assert_eq!(publisher, expected);
}

#[test]
fn every_variable_of_consumers_and_retries_is_read_into_its_option() {
    let s = with(&[
        ("ACEMQ_CONSUMER__PREFETCH", "64"),
        ("ACEMQ_CONSUMER__CONCURRENCY", "4"),
        ("ACEMQ_CONSUMER__SHUTDOWN_TIMEOUT", "PT45S"),
        ("ACEMQ_CONSUMER__DECLARE", "no"),
        ("ACEMQ_CONSUMER__RETRY__ENABLED", "TRUE"),
        ("ACEMQ_CONSUMER__RETRY__KIND", "Exponential"),
        ("ACEMQ_CONSUMER__RETRY__MAX_ATTEMPTS", "6"),
        ("ACEMQ_CONSUMER__RETRY__INITIAL_DELAY", "10"),
        ("ACEMQ_CONSUMER__RETRY__MAX_DELAY", "5m"),
        ("ACEMQ_CONSUMER__RETRY__MULTIPLIER", "3"),
        ("ACEMQ_CONSUMER__RETRY__JITTER", "0.1"),
        ("ACEMQ_CONSUMER__RETRY__GIVE_UP_AFTER", "1h"),
        ("ACEMQ_CONSUMER__RETRY__BROKER_WAIT_THRESHOLD", "20s"),
        ("ACEMQ_CONSUMER__RETRY__QUORUM_RUNGS", "on"),
    ])
    .unwrap();
    let c = &s.consumer;
    assert_eq!(
        (c.prefetch, c.concurrency, c.shutdown_timeout, c.declare),
        (64, 4, secs(45), false)
    );
    assert_eq!(s.drain_timeout(), secs(45));
    let r = &c.retry;
    assert!(r.enabled);
    assert_eq!(r.kind, RetryKind::Exponential);
    assert_eq!(
        (r.max_attempts, r.initial_delay, r.max_delay),
        (6, secs(10), secs(300))
    );
    assert_eq!((r.multiplier, r.jitter), (Some(3.0), Some(0.1)));
    assert_eq!(r.give_up_after, Some(secs(3600)));
    assert_eq!(r.broker_wait_threshold, secs(20));
    assert!(r.quorum_rungs);

    let policy = s.retry_policy().expect("enabled");
    let expected = RetryPolicy::exponential()
        .max_attempts(6)
        .initial_delay(secs(10))
        .max_delay(secs(300))
        .multiplier(3.0)
        .jitter(0.1)
        .max_message_age(secs(3600))
        .broker_wait_threshold(secs(20))
        .quorum_rungs(true);
    assert_eq!(policy, expected);
    assert_eq!(
        policy.schedule(),
        [secs(10), secs(30), secs(90), secs(270), secs(300)]
    );
    let options = format!("{:?}", s.consumer_options());
    let library = format!(
        "{:?}",
        ConsumerOptions::new()
            .prefetch(64)
            .concurrency(4)
            .shutdown_timeout(secs(45))
            .declare(false)
            .retry(expected)
    );
    assert_eq!(options, library);

    // Fixed, no ceiling; Python's top-level prefetch and its name for the threshold.
    let s = with(&[
        ("ACEMQ_PREFETCH", "7"),
        ("ACEMQ_CONSUMER__RETRY__ENABLED", "1"),
        ("ACEMQ_CONSUMER__RETRY__KIND", "fixed"),
        ("ACEMQ_CONSUMER__RETRY__INITIAL_DELAY", "2"),
        ("ACEMQ_CONSUMER__RETRY__WAIT_IN_BROKER_FROM", "1m"),
    ])
    .unwrap();
    assert_eq!(s.consumer.prefetch, 7);
    assert_eq!(
        s.retry_policy(),
        Some(RetryPolicy::fixed(3, secs(2)).broker_wait_threshold(secs(60)))
    );
    let s = with(&[
        ("ACEMQ_CONSUMER__RETRY__ENABLED", "yes"),
        ("ACEMQ_CONSUMER__RETRY__MAX_DELAY", "0"),
        ("ACEMQ_CONSUMER__RETRY__MAX_ATTEMPTS", "12"),
    ])
    .unwrap();
    let waits = s.retry_policy().unwrap().schedule();
    assert_eq!(
        waits.last(),
        Some(&secs(1024)),
        "0 is no ceiling: {waits:?}"
    );
}

#[test]
fn of_two_names_for_one_setting_the_consumers_own_and_the_majoritys_win() {
    for order in [false, true] {
        let mut vars = vec![
            ("ACEMQ_PREFETCH", "7"),
            ("ACEMQ_CONSUMER__PREFETCH", "9"),
            ("ACEMQ_CONSUMER__RETRY__WAIT_IN_BROKER_FROM", "1m"),
            ("ACEMQ_CONSUMER__RETRY__BROKER_WAIT_THRESHOLD", "2m"),
        ];
        if order {
            vars.reverse();
        }
        let s = with(&vars).unwrap();
        assert_eq!(s.consumer.prefetch, 9);
        assert_eq!(s.consumer.retry.broker_wait_threshold, secs(120));
    }
}

#[test]
fn an_empty_value_counts_as_not_set() {
    let s = with(&[
        ("ACEMQ_VIRTUAL_HOST", ""),
        ("ACEMQ_CONSUMER__PREFETCH", ""),
        ("ACEMQ_USERNAME", ""),
        ("ACEMQ_PASSWORD", ""),
    ])
    .unwrap();
    assert_eq!(s.virtual_host, None);
    assert_eq!(s.consumer.prefetch, 32);
    assert_eq!(s.username, None);
}

#[cfg(all(feature = "tls", feature = "test-ca"))]
#[test]
fn every_tls_variable_is_read_and_the_files_are_checked_when_the_options_are_made() {
    let s = Settings::from_vars([
        ("ACEMQ_URL", "amqps://10.0.0.7/"),
        ("ACEMQ_TLS__CERTIFICATE_AUTHORITY", "/nonexistent/ca.pem"),
        ("ACEMQ_TLS__CLIENT_CERTIFICATE", "/nonexistent/client.pem"),
        ("ACEMQ_TLS__CLIENT_KEY", "/nonexistent/client.key"),
        ("ACEMQ_TLS__SERVER_NAME", "rabbit.internal"),
        ("ACEMQ_TLS__VERIFICATION", "certificate"),
        ("ACEMQ_TLS__ALLOW_DEVELOPMENT_CERTIFICATES", "true"),
        ("ACEMQ_TLS__TRUST_SYSTEM_ROOTS", "true"),
    ])
    .unwrap();
    let t = &s.tls;
    assert_eq!(
        t.certificate_authority.as_deref(),
        Some(std::path::Path::new("/nonexistent/ca.pem"))
    );
    assert_eq!(
        t.client_certificate.as_deref(),
        Some(std::path::Path::new("/nonexistent/client.pem"))
    );
    assert_eq!(
        t.client_key.as_deref(),
        Some(std::path::Path::new("/nonexistent/client.key"))
    );
    assert_eq!(t.server_name.as_deref(), Some("rabbit.internal"));
    assert!(t.allow_development_certificates && t.trust_system_roots);
    // Loading does not read the files (a renewed one is read at each connect); making the
    // options checks them as opening would, naming the file.
    let e = s.connection_options().unwrap_err().to_string();
    assert!(e.contains("/nonexistent/ca.pem"), "{e}");

    // Real files (the family's development ones): the options are made.
    let certs = tempfile::tempdir().unwrap();
    acemq_amqp::test_ca::TestCa::new()
        .generate(certs.path())
        .unwrap();
    let file = |name: &str| certs.path().join(name).to_str().unwrap().to_string();
    let (ca, cert, key) = (file("ca.crt"), file("client.crt"), file("client.key"));
    let vars = [
        ("ACEMQ_URL", "amqps://10.0.0.7/"),
        ("ACEMQ_TLS__CERTIFICATE_AUTHORITY", ca.as_str()),
        ("ACEMQ_TLS__CLIENT_CERTIFICATE", cert.as_str()),
        ("ACEMQ_TLS__CLIENT_KEY", key.as_str()),
        ("ACEMQ_TLS__SERVER_NAME", "rabbit.internal"),
        ("ACEMQ_TLS__ALLOW_DEVELOPMENT_CERTIFICATES", "true"),
    ];
    let s = Settings::from_vars(vars).unwrap();
    let options = format!("{:?}", s.connection_options().unwrap());
    assert!(
        options.contains("roots=1")
            && options.contains("client_certificate")
            && options.contains("server_name=rabbit.internal")
            && options.contains("development_certificates_allowed"),
        "{options}"
    );
    // Without the allowance, the development authority is refused when the options are made.
    let e = Settings::from_vars(vars[..5].iter().copied())
        .unwrap()
        .connection_options()
        .unwrap_err()
        .to_string();
    assert!(e.contains("DEVELOPMENT"), "{e}");
}

#[test]
fn every_bad_value_is_refused_naming_its_variable_and_the_forms_it_takes() {
    let cases: &[(&str, &str, &str)] = &[
        ("ACEMQ_URL", "http://h/", "not a broker URL (amqp://"),
        (
            "ACEMQ_CONNECTION_TIMEOUT",
            "soon",
            "is not a duration: seconds",
        ),
        ("ACEMQ_CONNECTION_TIMEOUT", "0", "must be above zero"),
        ("ACEMQ_HEARTBEAT", "server", "whole seconds"),
        (
            "ACEMQ_HEARTBEAT",
            "1.5",
            "whole number of seconds from 0 (off) to 65535",
        ),
        (
            "ACEMQ_HEARTBEAT",
            "70000",
            "whole number of seconds from 0 (off) to 65535",
        ),
        ("ACEMQ_CONFIRM_TIMEOUT", "-3", "is not a duration"),
        (
            "ACEMQ_MAX_OUTSTANDING_PUBLISHES",
            "0",
            "is not a whole number of at least 1",
        ),
        ("ACEMQ_PUBLISHER_CONFIRMS", "maybe", "is not true or false"),
        (
            "ACEMQ_FORMAT",
            "cbor",
            "no codec is named \"cbor\": the names are `json`",
        ),
        ("ACEMQ_FORMAT", "avro", "needs a schema"),
        (
            "ACEMQ_CHANNEL_MAX",
            "65536",
            "is not a whole number from 0 to 65535",
        ),
        (
            "ACEMQ_FRAME_MAX",
            "1024",
            "is not a whole number from 4096 to 4294967295",
        ),
        ("ACEMQ_BACKOFF_MIN", "0s", "must be above zero"),
        ("ACEMQ_BACKOFF_MAX", "x", "is not a duration"),
        ("ACEMQ_OPERATION_TIMEOUT", "PT", "is not a duration"),
        (
            "ACEMQ_MAX_UNCONFIRMED_BYTES",
            "8MiB",
            "is not a whole number of at least 1",
        ),
        (
            "ACEMQ_PREFETCH",
            "0",
            "is not a whole number from 1 to 65535",
        ),
        (
            "ACEMQ_CONSUMER__PREFETCH",
            "abc",
            "`abc` is not a whole number from 1 to 65535",
        ),
        (
            "ACEMQ_CONSUMER__PREFETCH",
            "65536",
            "is not a whole number from 1 to 65535",
        ),
        (
            "ACEMQ_CONSUMER__CONCURRENCY",
            "0",
            "is not a whole number of at least 1",
        ),
        (
            "ACEMQ_CONSUMER__SHUTDOWN_TIMEOUT",
            "20 parsecs",
            "is not a duration",
        ),
        ("ACEMQ_CONSUMER__DECLARE", "2", "is not true or false"),
        (
            "ACEMQ_CONSUMER__RETRY__ENABLED",
            "enabled",
            "is not true or false",
        ),
        (
            "ACEMQ_CONSUMER__RETRY__KIND",
            "linear",
            "is not one of `exponential`, `fixed`",
        ),
        (
            "ACEMQ_CONSUMER__RETRY__MAX_ATTEMPTS",
            "0",
            "is not a whole number from 1 to",
        ),
        (
            "ACEMQ_CONSUMER__RETRY__INITIAL_DELAY",
            "1:2",
            "is not a duration",
        ),
        ("ACEMQ_CONSUMER__RETRY__MAX_DELAY", "P1M", "ISO 8601"),
        (
            "ACEMQ_CONSUMER__RETRY__MULTIPLIER",
            "0.5",
            "is not a number of at least 1",
        ),
        (
            "ACEMQ_CONSUMER__RETRY__JITTER",
            "1.5",
            "is not a number from 0 to 1",
        ),
        (
            "ACEMQ_CONSUMER__RETRY__GIVE_UP_AFTER",
            "never",
            "is not a duration",
        ),
        (
            "ACEMQ_CONSUMER__RETRY__WAIT_IN_BROKER_FROM",
            "?",
            "is not a duration",
        ),
        (
            "ACEMQ_CONSUMER__RETRY__BROKER_WAIT_THRESHOLD",
            "1y",
            "is not a duration",
        ),
        (
            "ACEMQ_CONSUMER__RETRY__QUORUM_RUNGS",
            "quorum",
            "is not true or false",
        ),
        (
            "ACEMQ_TLS__CLIENT_KEY_PASSWORD",
            "k3y-pass",
            "unencrypted PKCS#8",
        ),
        (
            "ACEMQ_TLS__SERVER_NAME",
            "rabbit internal",
            "is not a host name",
        ),
        ("ACEMQ_TLS__VERIFICATION", "nothing-at-all", "always checks"),
        (
            "ACEMQ_TLS__VERIFICATION",
            "none",
            "is not one of `certificate`, `nothing-at-all`",
        ),
        (
            "ACEMQ_TLS__ALLOW_DEVELOPMENT_CERTIFICATES",
            "sure",
            "is not true or false",
        ),
        (
            "ACEMQ_TLS__TRUST_SYSTEM_ROOTS",
            "all",
            "is not true or false",
        ),
        ("ACEMQ_ACTUATOR__ADDRESS", "9464", "is not host:port"),
        ("ACEMQ_ACTUATOR__PREFIX", "ops/", "is not a path prefix"),
    ];
    for (name, value, says) in cases {
        let e = refusal(&[(name, value)]);
        assert!(
            e.starts_with(&format!("invalid argument: {name}: ")),
            "{name}={value}: {e}"
        );
        assert!(
            e.contains(says),
            "{name}={value}: {e:?} does not say {says:?}"
        );
    }
    // The brief's own example, word for word.
    assert_eq!(
        refusal(&[("ACEMQ_CONSUMER__PREFETCH", "abc")]),
        "invalid argument: ACEMQ_CONSUMER__PREFETCH: `abc` is not a whole number from 1 to 65535"
    );
}

#[test]
fn settings_that_do_not_go_together_are_refused_naming_both() {
    type Vars<'a> = &'a [(&'a str, &'a str)];
    let cases: &[(Vars, &[&str])] = &[
        (
            &[("ACEMQ_USERNAME", "bob")],
            &["ACEMQ_USERNAME", "ACEMQ_PASSWORD", "both or neither"],
        ),
        (
            &[("ACEMQ_PASSWORD", "pw-alone-0451")],
            &["ACEMQ_PASSWORD", "ACEMQ_USERNAME"],
        ),
        (
            &[
                ("ACEMQ_TLS__CLIENT_CERTIFICATE", "/c.pem"),
                ("ACEMQ_URL", "amqps://h/"),
            ],
            &["ACEMQ_TLS__CLIENT_CERTIFICATE", "ACEMQ_TLS__CLIENT_KEY"],
        ),
        (
            &[("ACEMQ_TLS__CERTIFICATE_AUTHORITY", "/ca.pem")],
            &["TLS settings", "ACEMQ_URL", "not amqps://"],
        ),
        (
            &[("ACEMQ_BACKOFF_MIN", "20s")],
            &["ACEMQ_BACKOFF_MIN", "ACEMQ_BACKOFF_MAX"],
        ),
        (
            &[
                ("ACEMQ_CONSUMER__RETRY__KIND", "fixed"),
                ("ACEMQ_CONSUMER__RETRY__MULTIPLIER", "2"),
            ],
            &[
                "ACEMQ_CONSUMER__RETRY__MULTIPLIER",
                "ACEMQ_CONSUMER__RETRY__KIND",
            ],
        ),
        (
            &[
                ("ACEMQ_URL", "memory://settings"),
                ("ACEMQ_VIRTUAL_HOST", "v"),
            ],
            &["ACEMQ_VIRTUAL_HOST", "memory://"],
        ),
    ];
    for (vars, says) in cases {
        let e = refusal(vars);
        for word in *says {
            assert!(e.contains(word), "{vars:?}: {e:?} does not say {word:?}");
        }
        assert!(!e.contains("pw-alone-0451"), "{e}");
    }
}

#[test]
fn every_duration_form_is_read() {
    let forms: &[(&str, Duration)] = &[
        ("30", secs(30)),
        ("2.5", Duration::from_millis(2500)),
        ("500ms", Duration::from_millis(500)),
        ("30s", secs(30)),
        ("5m", secs(300)),
        ("2h", secs(7200)),
        ("1d", secs(86_400)),
        ("PT30S", secs(30)),
        ("pt1m30s", secs(90)),
        ("PT0.25S", Duration::from_millis(250)),
        ("P1DT2H", secs(93_600)),
        ("0:00:30", secs(30)),
        ("1:30:00", secs(5400)),
        ("0:00:01.5", Duration::from_millis(1500)),
        (" 45 ", secs(45)),
    ];
    for (text, expected) in forms {
        let s = with(&[("ACEMQ_CONFIRM_TIMEOUT", text)]).unwrap();
        assert_eq!(s.confirm_timeout, *expected, "{text:?}");
    }
}

#[test]
fn secrets_are_absent_from_debug_and_from_every_refusal() {
    let s = Settings::from_vars([
        ("ACEMQ_URL", "amqp://bob:url-s3cret-7@rabbit/"),
        ("ACEMQ_USERNAME", "alice"),
        ("ACEMQ_PASSWORD", "env-s3cret-9"),
    ])
    .unwrap();
    let shown = format!(
        "{s:?} {:?} {:#?}",
        s.connection_options().unwrap(),
        s.password
    );
    assert!(!shown.contains("s3cret"), "{shown}");
    assert!(shown.contains("<redacted>") && shown.contains("amqp://bob@rabbit:5672/"));

    let refusals = [
        refusal(&[("ACEMQ_URL", "amqp://bob:url-s3cret-7@rabbit:notaport/")]),
        refusal(&[("ACEMQ_URL", "amqp://bob:url-s3cret-7%zz@rabbit/")]),
        refusal(&[("ACEMQ_URL", "amqp://h/,amqps://bob:url-s3cret-7@[::1/")]),
        refusal(&[("ACEMQ_TLS__CLIENT_KEY_PASSWORD", "key-s3cret-1")]),
        refusal(&[("ACEMQ_PASSWORD", "env-s3cret-9")]),
    ];
    for e in &refusals {
        assert!(!e.contains("s3cret"), "a secret in {e}");
    }
    assert!(
        refusals[2].contains("its address number 2"),
        "{}",
        refusals[2]
    );
}

#[test]
fn unknown_variables_are_warned_about_by_name_and_ignored() {
    support::logs::capture(log::LevelFilter::Warn);
    let s = with(&[
        ("ACEMQ_CONSUMER_PREFETCH", "64"),
        ("ACEMQ_HEALTH__PATH", "/health/acemq"),
        ("ACEMQ_ZEBRA_STRIPES", "12"),
        ("ACEMQ_TEST_AMQP_URL", "amqp://x/"),
        ("NOT_OURS_AT_ALL", "1"),
    ])
    .unwrap();
    assert_eq!(s.consumer.prefetch, 32, "a typo changes nothing");
    let lines = support::logs::lines();
    let said = |words: &[&str]| lines.iter().any(|l| words.iter().all(|w| l.contains(w)));
    assert!(
        said(&[
            "ACEMQ_CONSUMER_PREFETCH",
            "did you mean ACEMQ_CONSUMER__PREFETCH?"
        ]),
        "{lines:#?}"
    );
    assert!(
        said(&["ACEMQ_HEALTH__PATH", "not read", "ACEMQ_ACTUATOR__PREFIX"]),
        "{lines:#?}"
    );
    assert!(
        said(&["ACEMQ_ZEBRA_STRIPES", "not a setting"]),
        "{lines:#?}"
    );
    assert!(!said(&["ACEMQ_TEST_AMQP_URL"]), "{lines:#?}");
    assert!(!said(&["NOT_OURS_AT_ALL"]), "{lines:#?}");
}

#[cfg(feature = "toml")]
#[test]
fn a_toml_file_holds_the_same_keys_and_the_environment_overrides_it() {
    support::logs::capture(log::LevelFilter::Warn);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("acemq.toml");
    std::fs::write(
        &file,
        r#"
url = ["amqp://h1/", "amqp://h2/"]
client_name = "from-the-file"
confirm_timeout = 12
heartbeat = "PT20S"

[consumer]
prefetch = 64
concurrency = 2
shutdown_timeout = "0:00:25"
prefecth = 3

[consumer.retry]
enabled = true
kind = "fixed"
max_attempts = 4
initial_delay = 2.5

[tls]
verification = "certificate"

[actuator]
address = "0.0.0.0:9464"
prefix = "/ops"

[topology]
queues = ["orders"]
"#,
    )
    .unwrap();
    let from_file = Settings::from_toml_file(&file).unwrap();
    assert_eq!(from_file.urls, ["amqp://h1/", "amqp://h2/"]);
    assert_eq!(from_file.client_name.as_deref(), Some("from-the-file"));
    assert_eq!(from_file.confirm_timeout, secs(12));
    assert_eq!(from_file.heartbeat, secs(20));
    assert_eq!(from_file.consumer.prefetch, 64);
    assert_eq!(from_file.consumer.concurrency, 2);
    assert_eq!(from_file.drain_timeout(), secs(25));
    assert_eq!(
        from_file.retry_policy(),
        Some(RetryPolicy::fixed(4, Duration::from_millis(2500)))
    );
    assert_eq!(from_file.actuator.address, "0.0.0.0:9464");
    assert_eq!(from_file.actuator.prefix, "/ops");
    let lines = support::logs::lines();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("`consumer.prefecth`") && l.contains("`consumer.prefetch`?")),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("`topology`") && l.contains("declared in code")),
        "{lines:#?}"
    );

    // The environment wins over the file, key by key.
    let s = Settings::load_with(
        Some(&file),
        [
            ("ACEMQ_CONSUMER__PREFETCH", "8"),
            ("ACEMQ_URL", "amqp://env/"),
        ],
    )
    .unwrap();
    assert_eq!(s.consumer.prefetch, 8);
    assert_eq!(s.urls, ["amqp://env/"]);
    assert_eq!(
        s.consumer.concurrency, 2,
        "the file's, where the environment says nothing"
    );
    assert_eq!(s.client_name.as_deref(), Some("from-the-file"));

    // ACEMQ_CONFIG_FILE names the file, over the argument.
    let other = dir.path().join("other.toml");
    std::fs::write(&other, "client_name = \"named-by-the-variable\"\n").unwrap();
    let s = Settings::load_with(
        Some(&file),
        [("ACEMQ_CONFIG_FILE", other.to_str().unwrap())],
    )
    .unwrap();
    assert_eq!(s.client_name.as_deref(), Some("named-by-the-variable"));
    let s = Settings::load_with(None, [("ACEMQ_CONFIG_FILE", other.to_str().unwrap())]).unwrap();
    assert_eq!(s.client_name.as_deref(), Some("named-by-the-variable"));
    let s = Settings::load_with(None, [("ACEMQ_URL", "amqp://env/")]).unwrap();
    assert_eq!(
        s,
        Settings::from_vars([("ACEMQ_URL", "amqp://env/")]).unwrap()
    );

    // A missing file is an I/O error naming it and the variable.
    let missing = dir.path().join("missing.toml");
    let e =
        Settings::load_with(None, [("ACEMQ_CONFIG_FILE", missing.to_str().unwrap())]).unwrap_err();
    assert!(matches!(e, acemq_amqp::Error::Io { .. }), "{e:?}");
    assert!(
        e.to_string().contains("missing.toml") && e.to_string().contains("ACEMQ_CONFIG_FILE"),
        "{e}"
    );
}

#[cfg(feature = "toml")]
#[test]
fn a_bad_toml_value_is_refused_naming_its_key_and_no_secret() {
    let e = Settings::from_toml_str("[consumer]\nprefetch = \"abc\"\n")
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "invalid argument: `consumer.prefetch` in the TOML settings: `abc` is not a whole number \
         from 1 to 65535"
    );
    let e = Settings::from_toml_str("[consumer]\nprefetch = [1, 2]\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`consumer.prefetch`") && e.contains("a list"),
        "{e}"
    );
    let e = Settings::from_toml_str("consumer = 5\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("consumer"), "{e}");
    // Not TOML: the line and column, never the line (it holds a password).
    let e = Settings::from_toml_str("username = \"bob\"\npassword = \"toml-s3cret-2\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("are not TOML at line 2"), "{e}");
    assert!(!e.contains("s3cret"), "{e}");
    let e = Settings::from_toml_str("url = \"amqp://bob:toml-s3cret-3@h:x/\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`url` in the TOML settings: not a broker URL"),
        "{e}"
    );
    assert!(!e.contains("s3cret"), "{e}");
    let shown = format!(
        "{:?}",
        Settings::from_toml_str("username = \"bob\"\npassword = \"toml-s3cret-4\"\n").unwrap()
    );
    assert!(!shown.contains("s3cret"), "{shown}");
}

/// The settings alone make the connection, the publisher and the consumer on the real broker.
#[test]
fn a_connection_made_from_the_settings_alone_publishes_and_consumes_on_the_broker() {
    use acemq_amqp::{Connection, Message, Outcome, QueueSpec};

    let url = support::amqp_url();
    let settings = Settings::from_vars([
        ("ACEMQ_URL", url.as_str()),
        ("ACEMQ_CLIENT_NAME", "settings-test"),
        ("ACEMQ_CONNECTION_TIMEOUT", "5s"),
        ("ACEMQ_CONFIRM_TIMEOUT", "PT10S"),
        ("ACEMQ_CONSUMER__PREFETCH", "4"),
        ("ACEMQ_CONSUMER__SHUTDOWN_TIMEOUT", "5"),
    ])
    .unwrap();
    let connection = match Connection::open_with(settings.connection_options().unwrap()) {
        Ok(c) => c,
        Err(e) => panic!("RabbitMQ is not reachable at {url} ({e}): run `scripts/test`"),
    };
    let mut clean = support::Cleanup::new(&connection);
    let queue = clean.consumed_queue(&support::unique("settings"), &[]);
    connection
        .declare_queue(&QueueSpec::new(&queue).classic())
        .unwrap();
    let publisher = connection
        .publisher_with(settings.publisher_options())
        .unwrap();
    publisher
        .publish("", &queue, Message::new("from the settings"))
        .unwrap();
    let (tx, rx) = crossbeam_channel::bounded(1);
    let consumer = connection
        .consumer(&queue, settings.consumer_options())
        .unwrap()
        .start(move |m: &Message| {
            let _ = tx.try_send(m.clone());
            Ok(Outcome::Accept)
        })
        .unwrap();
    let got = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the message");
    assert_eq!(got.body, b"from the settings");
    let origin = got.envelope.origin.clone().unwrap_or_default();
    assert!(origin.starts_with("settings-test@"), "{origin}");
    consumer.close().unwrap();
    publisher.close().unwrap();
    connection.close().unwrap();
}

#[cfg(feature = "actuator")]
#[test]
fn the_actuator_listens_where_the_settings_say() {
    let s = with(&[
        ("ACEMQ_ACTUATOR__ADDRESS", "0.0.0.0:9465"),
        ("ACEMQ_ACTUATOR__PREFIX", "/ops"),
    ])
    .unwrap();
    let options = format!("{:?}", s.actuator_options());
    assert!(
        options.contains(r#"bind: "0.0.0.0:9465""#) && options.contains(r#"prefix: "/ops""#),
        "{options}"
    );
    let default = format!("{:?}", Settings::default().actuator_options());
    assert_eq!(
        default,
        format!("{:?}", acemq_amqp::actuator::ActuatorOptions::new())
    );
}
