//! The README's example is the file `examples/quickstart.rs`, word for word, so the example a
//! newcomer copies is one that compiles and runs (`cargo run --example quickstart`); and what
//! the README says of it holds (on the real broker).

mod support;

#[test]
fn the_readme_example_is_examples_quickstart_word_for_word() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/quickstart.rs"
    ))
    .expect("examples/quickstart.rs");
    let start = readme
        .find("```rust\n")
        .expect("the README has a Rust example")
        + "```rust\n".len();
    let end = start + readme[start..].find("```").expect("the example block ends");
    assert_eq!(
        &readme[start..end],
        example,
        "README.md's first Rust block differs from examples/quickstart.rs: copy the file into it"
    );
}

/// What the README says after the example (issue 37, item 9): with the default options — the
/// example's `connection.consume(queue, handler)` — a handler's `Err` is dead-lettered at once
/// to `{queue}.dlq` with its reason (`RetryPolicy::none()`): one attempt, no retry.
#[test]
fn with_the_default_options_a_handlers_err_is_dead_lettered_at_once_as_the_readme_says() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use acemq_amqp::{dead_letter_queue, Message, QueueSpec};
    use support::{connect, eventually, publish_n, raw::Raw, unique, Cleanup};

    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("readme-default"), &[]);
    conn.declare_queue(&QueueSpec::new(&q).classic()).unwrap();
    let ids = publish_n(&conn, &q, 1, true);
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let consumer = conn
        .consume(&q, move |_: &Message| {
            c.fetch_add(1, Ordering::SeqCst);
            Err("the order cannot be read".into())
        })
        .unwrap();
    let dlq = dead_letter_queue(&q);
    assert!(eventually(Duration::from_secs(20), || conn
        .queue_info(&dlq)
        .unwrap()
        .message_count
        == 1));
    consumer.close().unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one attempt, no retry");
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 0);
    let (props, _, _) = Raw::open().get(&dlq).expect("the dead letter");
    let headers = props.headers().clone().unwrap_or_default();
    let text = |name: &str| match headers.get(name) {
        Some(amiquip::AmqpValue::LongString(s)) => s.clone(),
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(text(acemq_amqp::headers::ID), ids[0]);
    assert!(
        text(acemq_amqp::headers::ERROR).contains("the order cannot be read"),
        "{headers:?}"
    );
}

/// The README says `cargo run --example quickstart -- memory://demo` runs the quickstart with no
/// RabbitMQ: the example binary (built by `cargo test` beside this test) handles its message on
/// the in-process broker.
#[test]
fn the_quickstart_runs_on_memory_without_rabbitmq_as_the_readme_says() {
    let exe = std::env::current_exe().expect("this test's path");
    let quickstart = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("examples").join("quickstart"))
        .expect("the build directory");
    assert!(
        quickstart.exists(),
        "{} is missing: cargo test builds the examples beside the tests",
        quickstart.display()
    );
    let url = format!("memory://readme-quickstart-{}", std::process::id());
    let out = std::process::Command::new(&quickstart)
        .arg(&url)
        .output()
        .expect("running the quickstart");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the quickstart on {url} failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(r#"handled "#) && stdout.contains(r#"{"order_id":"o-1"}"#),
        "the quickstart printed {stdout:?}"
    );
}

/// The README's service quickstart is `examples/service.rs`'s `main`, line for line (the
/// README leaves out the imports and the final `println!`).
#[test]
fn the_readme_service_block_is_in_examples_service() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let example = std::fs::read_to_string(format!("{root}/examples/service.rs")).unwrap();
    let start = readme
        .find("### A service")
        .expect("the README's service section");
    let block = &readme[start..];
    let block = &block[block.find("```rust,ignore\n").expect("its code") + 15..];
    let block = &block[..block.find("```").unwrap()];
    let lines: Vec<&str> = example.lines().map(str::trim).collect();
    for line in block.lines().map(str::trim).filter(|l| !l.is_empty()) {
        assert!(
            lines.contains(&line),
            "README's service quickstart has {line:?}, which examples/service.rs does not: copy it"
        );
    }
}
