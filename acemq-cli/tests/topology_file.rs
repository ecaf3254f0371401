//! `acemq topology plan|apply|validate --file FILE` as a process against the real broker: plan
//! changes nothing, apply creates, validate passes then; a drifted queue makes apply refuse and
//! validate fail (exit 1), naming the difference; a bad file is a usage error (exit 2).

#[allow(unexpected_cfgs)]
#[path = "../../tests/support/mod.rs"]
mod support;

use std::process::{Command, Output};
use std::time::Duration;

use acemq_amqp::{Error, QueueSpec};
use support::{connect, unique, Cleanup};

fn acemq(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_acemq"))
        .env("ACEMQ_URL", support::amqp_url())
        .args(args)
        .output()
        .expect("run acemq");
    eprintln!(
        "$ acemq {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn plan_apply_and_validate_a_topology_file() {
    let conn = connect();
    let (q, x) = (unique("cli-topo"), unique("cli-topo-x"));
    let mut clean = Cleanup::new(&conn);
    clean.consumed_queue(&q, &[]);
    clean.exchange(&x);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("topology.toml");
    std::fs::write(
        &file,
        format!(
            "[[exchanges]]\nname = \"{x}\"\ntype = \"fanout\"\n\n\
             [[queues]]\nname = \"{q}\"\ntype = \"classic\"\ndead_letter = true\n\n\
             [[bindings]]\nexchange = \"{x}\"\nqueue = \"{q}\"\n"
        ),
    )
    .unwrap();
    let file = file.to_str().unwrap();

    let out = acemq(&["topology", "plan", "--file", file]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("create   queue {q}")),
        "{}",
        text(&out)
    );
    assert!(
        matches!(conn.queue_info(&q), Err(Error::NotFound { .. })),
        "plan changed nothing"
    );

    let out = acemq(&["topology", "validate", "--file", file]);
    assert_eq!(out.status.code(), Some(1), "missing: {}", text(&out));

    let out = acemq(&["topology", "apply", "--file", file]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    conn.queue_info(&acemq_amqp::dead_letter_queue(&q))
        .expect("created");
    let out = acemq(&["--json", "topology", "validate", "--file", file]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // Drift: the queue is replaced by one with a TTL.
    conn.delete_queue(&q).unwrap();
    conn.declare_queue(
        &QueueSpec::new(&q)
            .classic()
            .message_ttl(Duration::from_secs(9)),
    )
    .unwrap();
    for command in ["apply", "validate"] {
        let out = acemq(&["topology", command, "--file", file]);
        assert_eq!(out.status.code(), Some(1), "{command}: {}", text(&out));
        assert!(
            text(&out).contains("x-message-ttl"),
            "{command}: {}",
            text(&out)
        );
        assert!(
            text(&out).contains(&format!("DIFFERS  queue {q}")),
            "{command} shows the plan it refused on: {}",
            text(&out)
        );
    }
}

#[test]
fn a_bad_topology_file_is_a_usage_error_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("topology.json");
    std::fs::write(&file, r#"{"queues": [{"name": "q", "typ": "classic"}]}"#).unwrap();
    let out = acemq(&["topology", "plan", "--file", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("unknown field `typ`"), "{}", text(&out));
}
