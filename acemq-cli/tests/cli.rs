//! The `acemq` command line, run as a process on the built binary against the real broker and
//! databases.

// The library's test helpers. They gate some parts on the library's features, which this crate
// does not have: those parts are left out (hence the allow), and the SQL helpers these tests
// need are taken in directly (this crate always has both SQL back ends).
#[path = "../../tests/support/db.rs"]
mod db;
#[allow(unexpected_cfgs)]
#[path = "../../tests/support/mod.rs"]
mod support;

use std::process::{Command, Output};
use std::time::Duration;

use acemq_amqp::patterns::outbox::{
    record_message, OutboxRelay, OutboxRelayOptions, OutboxStore, SqlOutboxStore,
    SqlOutboxStoreOptions,
};
use acemq_amqp::{Connection, Message, QueueSpec};
use db::{Backend, Db};
use serde_json::Value;
use support::Cleanup;

/// Runs `acemq` with `args` (and `--url` of the test broker unless the args give one).
fn acemq(args: &[&str]) -> Output {
    acemq_with_db(None, args)
}

/// [`acemq`] with `ACEMQ_DB` set to `db` (unset with `None`).
fn acemq_with_db(db: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_acemq"));
    match db {
        Some(db) => cmd.env("ACEMQ_DB", db),
        None => cmd.env_remove("ACEMQ_DB"),
    };
    cmd.env("ACEMQ_URL", support::amqp_url());
    cmd.args(args);
    let out = cmd.output().expect("run acemq");
    eprintln!(
        "$ acemq {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The `acemq_` tables in the SQLite file at `path`.
fn acemq_tables(path: &std::path::Path) -> i64 {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name LIKE 'acemq_%'",
            [],
            |r| r.get(0),
        )
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Every stdout line parsed as JSON (fails the test on a line that is not one object).
fn json_lines(o: &Output) -> Vec<Value> {
    stdout(o)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}"));
            assert!(v.is_object(), "{l}");
            v
        })
        .collect()
}

/// A dead letter as a consumer of `queue` leaves it: attempt, error, first seen an hour ago.
fn dead_letter(i: usize, error: &str) -> Message {
    let mut m = Message::new(format!("{{\"n\":{i}}}"))
        .with_type("OrderPlaced")
        .with_content_type("application/json")
        .with_header("tenant", format!("t{i}"));
    m.envelope.attempt = 5;
    m.envelope.error = Some(error.to_string());
    m.envelope.first_seen_ms = acemq_amqp::now_ms() - 3_600_000;
    m
}

/// Publishes `messages` to `queue` (default exchange, confirmed); returns their ids.
/// A classic queue `{unique(prefix)}.dlq` (a dead-letter queue as the CLI finds one), declared
/// on the tests' broker and deleted at the end.
fn dead_letter_queue_of(connection: &Connection, cleanup: &mut Cleanup, prefix: &str) -> String {
    let q = cleanup.queue(&format!("{}.dlq", support::unique(prefix)));
    connection
        .declare_queue(&QueueSpec::new(&q).classic())
        .unwrap();
    q
}

fn put(connection: &Connection, queue: &str, messages: Vec<Message>) -> Vec<String> {
    let p = connection.publisher().expect("publisher");
    let ids = messages
        .into_iter()
        .map(|m| {
            let id = m.id().to_string();
            p.publish("", queue, m).expect("publish");
            id
        })
        .collect();
    p.close().expect("close publisher");
    ids
}

/// Takes everything on `queue` (consuming it): `(id, error, attempt, body, tenant header)`.
fn drain(connection: &Connection, queue: &str) -> Vec<(String, Option<String>, u32, Vec<u8>)> {
    let mut got = Vec::new();
    while let Some(m) = connection.get(queue).expect("get") {
        got.push((
            m.envelope.id.clone(),
            m.envelope.error.clone(),
            m.envelope.attempt,
            m.body.clone(),
        ));
        assert!(got.len() < 10_000);
    }
    got
}

fn count(connection: &Connection, queue: &str) -> u32 {
    connection
        .queue_info(queue)
        .expect("queue info")
        .message_count
}

#[test]
fn peek_shows_envelopes_and_leaves_the_queue_exactly_as_it_was() {
    let connection = support::connect();
    let mut cleanup = Cleanup::new(&connection);
    let q = dead_letter_queue_of(&connection, &mut cleanup, "cli.peek");
    let mut messages: Vec<Message> = (0..6).map(|i| dead_letter(i, "boom")).collect();
    messages[1] = messages[1]
        .clone()
        .with_header("acemq-replayed-from", q.as_str())
        .with_header("acemq-replayed-at", "2026-11-30T03:00:00Z")
        .with_header("acemq-replay-count", 2i64);
    let ids = put(&connection, &q, messages);
    let before = {
        // The reference: what a consumer would read, compared after the peeks.
        ids.clone()
    };

    let out = acemq(&["--json", "peek", &q, "--limit", "4"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lines = json_lines(&out);
    let shown: Vec<&str> = lines
        .iter()
        .map(|l| l["message"]["id"].as_str().unwrap())
        .collect();
    assert_eq!(shown, &ids[..4], "the head of the queue, in order");
    let first = &lines[0]["message"];
    assert_eq!(first["type"], "OrderPlaced");
    assert_eq!(first["attempt"], 5);
    assert_eq!(first["error"], "boom");
    assert!(first["age_ms"].as_u64().unwrap() >= 3_600_000);
    assert_eq!(lines[1]["message"]["replayed"]["count"], 2);
    assert_eq!(lines[1]["message"]["replayed"]["from"], q.as_str());

    // Human output too, and a second peek past the end of the queue.
    let out = acemq(&["peek", &q, "--limit", "100"]);
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 6, "{text}");
    assert!(text.contains("replayed=2x from"), "{text}");
    assert!(text.contains("type=OrderPlaced  attempt=5"), "{text}");

    // Count and order unchanged, every message as it was.
    assert_eq!(count(&connection, &q), 6);
    let after = drain(&connection, &q);
    let after_ids: Vec<String> = after.iter().map(|m| m.0.clone()).collect();
    assert_eq!(after_ids, before, "same messages, same order");
    for (i, (_, error, attempt, body)) in after.iter().enumerate() {
        assert_eq!(error.as_deref(), Some("boom"));
        assert_eq!(*attempt, 5);
        assert_eq!(body, format!("{{\"n\":{i}}}").as_bytes());
    }
}

#[test]
fn peek_refuses_a_quorum_queue_unless_unordered() {
    let connection = support::connect();
    let mut cleanup = Cleanup::new(&connection);
    let q = cleanup.queue(&support::unique("cli.peek.quorum"));
    connection
        .declare_queue(&QueueSpec::new(&q).quorum())
        .unwrap();
    put(&connection, &q, vec![dead_letter(0, "e")]);
    let out = acemq(&["peek", &q]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("quorum queue"), "{}", stderr(&out));
    // The CLI names its flag, not the library's function.
    assert!(stderr(&out).contains("--unordered"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("peek_unordered"), "{}", stderr(&out));
    let out = acemq(&["--json", "peek", &q]);
    assert_eq!(out.status.code(), Some(1));
    let error = json_lines(&out)[0]["error"].as_str().unwrap().to_string();
    assert!(
        error.contains("--unordered") && !error.contains("peek_unordered"),
        "{error}"
    );
    let out = acemq(&["--json", "peek", &q, "--unordered"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(json_lines(&out).len(), 1);
    // A quorum queue counts the returned message as ready a moment after the nack.
    assert!(support::eventually(Duration::from_secs(5), || count(
        &connection,
        &q
    ) == 1));
}

#[test]
fn replay_dry_run_lists_and_moves_nothing_then_replay_moves_the_matching_ones() {
    let connection = support::connect();
    let mut cleanup = Cleanup::new(&connection);
    let work = cleanup.consumed_queue(&support::unique("cli.replay"), &[]);
    let dlq = acemq_amqp::dead_letter_queue(&work);
    connection
        .declare_queue(&QueueSpec::new(&work).classic())
        .unwrap();
    connection
        .declare_queue(&QueueSpec::new(&dlq).classic())
        .unwrap();
    let errors = [
        "timeout talking to stock",
        "bad payload",
        "timeout again",
        "bad",
    ];
    let ids = put(
        &connection,
        &dlq,
        errors
            .iter()
            .enumerate()
            .map(|(i, e)| dead_letter(i, e))
            .collect(),
    );

    // Dry run, given the work queue: lists what would move, leaves the queue as it was.
    let out = acemq(&[
        "--json",
        "replay",
        &work,
        "--dry-run",
        "--error-contains",
        "timeout",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lines = json_lines(&out);
    let listed: Vec<&str> = lines
        .iter()
        .filter_map(|l| l["would_move"].as_str())
        .collect();
    assert_eq!(listed, [ids[0].as_str(), ids[2].as_str()]);
    assert_eq!(lines[0]["type"], "OrderPlaced");
    assert_eq!(lines[0]["attempt"], 5);
    assert_eq!(lines[0]["error"], "timeout talking to stock");
    assert!(lines[0]["age_ms"].as_u64().unwrap() >= 3_600_000);
    let summary = lines.last().unwrap();
    assert_eq!(summary["queue"], dlq.as_str());
    assert_eq!(summary["dry_run"], true);
    assert_eq!(summary["would_move"], 2);
    assert_eq!(summary["skipped"], 2);
    assert_eq!(summary["moved"], 0);
    assert_eq!(summary["stopped"], "drained");
    assert_eq!(count(&connection, &dlq), 4, "the dry run moved nothing");
    assert_eq!(count(&connection, &work), 0);
    // Order on the dead-letter queue unchanged: peek shows it.
    let peeked = json_lines(&acemq(&["--json", "peek", &dlq, "--limit", "10"]));
    let order: Vec<&str> = peeked
        .iter()
        .map(|l| l["message"]["id"].as_str().unwrap())
        .collect();
    assert_eq!(order, ids.iter().map(String::as_str).collect::<Vec<_>>());

    // The real thing (human output): the two timeouts go home, the others stay, in order.
    let out = acemq(&["replay", &dlq, "--error-contains", "timeout"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("moved 2, skipped 2 (drained)"),
        "{}",
        stdout(&out)
    );
    let home = drain(&connection, &work);
    assert_eq!(
        home.iter().map(|m| m.0.as_str()).collect::<Vec<_>>(),
        [ids[0].as_str(), ids[2].as_str()]
    );
    assert!(
        home.iter().all(|m| m.1.is_none() && m.2 == 1),
        "restarted: attempt 1, error cleared"
    );
    let left = drain(&connection, &dlq);
    assert_eq!(
        left.iter().map(|m| m.0.as_str()).collect::<Vec<_>>(),
        [ids[1].as_str(), ids[3].as_str()]
    );

    // --no-restart and --limit: one moved, attempt and error kept.
    put(
        &connection,
        &dlq,
        vec![dead_letter(7, "x"), dead_letter(8, "y")],
    );
    let out = acemq(&["--json", "replay", &work, "--limit", "1", "--no-restart"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(json_lines(&out).last().unwrap()["stopped"], "limit");
    let home = drain(&connection, &work);
    assert_eq!(home.len(), 1);
    assert_eq!((home[0].1.as_deref(), home[0].2), (Some("x"), 5));
    assert_eq!(count(&connection, &dlq), 1);
}

/// The keys of a JSON object, in the order they are printed.
fn keys(v: &Value) -> Vec<String> {
    v.as_object().expect("an object").keys().cloned().collect()
}

/// docs/operating.md shows `acemq --json replay … --dry-run` as real output: its lines have the
/// keys acemq prints, in the order it prints them (issue 37).
#[test]
fn the_operating_pages_dry_run_json_has_the_keys_in_the_order_acemq_prints_them() {
    let connection = support::connect();
    let mut cleanup = Cleanup::new(&connection);
    let work = cleanup.consumed_queue(&support::unique("cli.doc-json"), &[]);
    let dlq = acemq_amqp::dead_letter_queue(&work);
    for q in [&work, &dlq] {
        connection
            .declare_queue(&QueueSpec::new(q).classic())
            .unwrap();
    }
    put(
        &connection,
        &dlq,
        vec![dead_letter(0, "unknown sku sku-99")],
    );
    let out = acemq(&["--json", "replay", &dlq, "--dry-run"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let real: Vec<Vec<String>> = json_lines(&out).iter().map(keys).collect();
    assert_eq!(real.len(), 2, "one message and the summary");

    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/operating.md"))
            .expect("read docs/operating.md");
    let shown: Vec<Vec<String>> = page
        .lines()
        .skip_while(|l| !l.starts_with("$ acemq --json replay"))
        .skip(1)
        .take_while(|l| l.starts_with('{'))
        .map(|l| keys(&serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}"))))
        .collect();
    assert_eq!(
        shown, real,
        "docs/operating.md's `acemq --json replay` lines have other keys or another order"
    );
    assert_eq!(count(&connection, &dlq), 1, "the dry run moved nothing");
}

#[test]
fn a_replay_that_cannot_route_fails_with_exit_1_and_loses_nothing() {
    let connection = support::connect();
    let mut cleanup = Cleanup::new(&connection);
    let dlq = dead_letter_queue_of(&connection, &mut cleanup, "cli.noroute");
    // Its work queue does not exist: the copy is unroutable.
    put(&connection, &dlq, vec![dead_letter(0, "e")]);
    let out = acemq(&["replay", &dlq]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out).lines().count(),
        1,
        "one line: {}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("stopped after moved 0"),
        "{}",
        stderr(&out)
    );
    assert_eq!(count(&connection, &dlq), 1);
}

fn outbox_release_then_a_sweep_publishes(backend: Backend) {
    let connection = support::connect();
    let mut cleanup = Cleanup::new(&connection);
    let q = cleanup.queue(&support::unique("cli.outbox"));
    let db = match backend {
        Backend::Sqlite => Db::sqlite(),
        Backend::Postgres => Db::postgres(),
        Backend::Mysql => Db::mysql(),
    };
    let table = db.table("outbox");
    let db_url = match backend {
        Backend::Sqlite => format!("sqlite:{}", db.sqlite_path().display()),
        Backend::Postgres => db::PG_URL.to_string(),
        Backend::Mysql => db::mysql_url(),
    };
    let store = || {
        SqlOutboxStore::open(
            db.factory(),
            SqlOutboxStoreOptions::default()
                .table(table.clone())
                .max_attempts(1),
        )
        .unwrap()
    };
    store().create_table().unwrap();
    // Two records for a queue that does not exist yet: the sweep fails them, and with one
    // attempt allowed they retire.
    let mut ids = Vec::new();
    for i in 0..2 {
        let message = Message::new(format!("order {i}"));
        let record = record_message("", &q, &message).unwrap();
        ids.push(db.in_tx(true, |tx| store().add(tx, &record).unwrap()));
    }
    let relay = OutboxRelay::new(&connection, store(), OutboxRelayOptions::new()).unwrap();
    let _ = relay.sweep();
    assert_eq!(store().retired().unwrap().len(), 2);

    let base = ["--db", &db_url, "--table", &table, "--max-attempts", "1"];
    let run = |args: &[&str]| {
        let mut all: Vec<&str> = vec!["--json", "outbox"];
        all.extend_from_slice(args);
        all.extend_from_slice(&base);
        acemq(&all)
    };
    let out = run(&["status"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let status = &json_lines(&out)[0];
    assert_eq!(status["pending"], 0);
    assert_eq!(status["retired"], 2);
    // In words for people: no `pending 0, oldest pending -` (issue 48, 10).
    let mut text_args = vec!["outbox", "status"];
    text_args.extend_from_slice(&base);
    let text = stdout(&acemq(&text_args));
    assert_eq!(text, format!("{table}: nothing pending, retired 2\n"));

    let out = run(&["retired"]);
    assert_eq!(out.status.code(), Some(0));
    let retired = json_lines(&out);
    assert_eq!(retired.len(), 2);
    assert_eq!(retired[0]["retired"], ids[0]);
    assert_eq!(retired[0]["attempts"], 1);
    assert!(
        retired[0]["last_error"].as_str().unwrap().contains(&q),
        "the last error names where it went: {}",
        retired[0]
    );

    // Releasing something that is not retired changes nothing and says so.
    let out = run(&["release", "987654321"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("not retired"), "{}", stderr(&out));

    // Release one, create the queue, sweep: it is published; the other stays retired.
    connection
        .declare_queue(&QueueSpec::new(&q).classic())
        .unwrap();
    let id0 = ids[0].to_string();
    let out = run(&["release", &id0]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(json_lines(&out)[0]["released"], ids[0]);
    let status = &json_lines(&run(&["status"]))[0];
    assert_eq!(
        (status["pending"].as_u64(), status["retired"].as_u64()),
        (Some(1), Some(1))
    );
    assert!(status["lag_ms"].as_u64().is_some());
    let text = stdout(&acemq(&text_args));
    assert!(
        text.starts_with(&format!("{table}: pending 1, oldest pending "))
            && text.ends_with(" (lag), retired 1\n"),
        "{text}"
    );
    assert_eq!(relay.sweep().unwrap(), 1);
    assert_eq!(count(&connection, &q), 1);
    let m = connection.get(&q).unwrap().unwrap();
    assert_eq!(m.body, b"order 0");

    // --all releases the rest.
    let out = run(&["release", "--all"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(relay.sweep().unwrap(), 1);
    assert!(store().retired().unwrap().is_empty());
    assert_eq!(count(&connection, &q), 1);
    relay.close().unwrap();
}

/// An empty outbox is said in words, not `pending 0, oldest pending - (lag), retired 0`; its JSON
/// keeps its keys (issue 48, 10).
#[test]
fn outbox_status_on_an_empty_outbox_says_so_in_words() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("outbox.db").display());
    let out = acemq(&["schema", "create", "--db", &url]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = acemq(&["outbox", "status", "--db", &url]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "acemq_outbox: empty: nothing pending, nothing retired\n"
    );
    let out = acemq(&["--json", "outbox", "status", "--db", &url]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 1);
    assert_eq!(
        keys(&lines[0]),
        ["table", "pending", "oldest_pending", "lag_ms", "retired"]
    );
    assert_eq!(lines[0]["table"], "acemq_outbox");
    assert_eq!(lines[0]["pending"], 0);
    assert_eq!(lines[0]["retired"], 0);
    assert!(lines[0]["oldest_pending"].is_null() && lines[0]["lag_ms"].is_null());
}

#[test]
fn outbox_release_then_a_sweep_publishes_sqlite() {
    outbox_release_then_a_sweep_publishes(Backend::Sqlite);
}

#[test]
fn outbox_release_then_a_sweep_publishes_postgres() {
    outbox_release_then_a_sweep_publishes(Backend::Postgres);
}

#[test]
fn outbox_release_then_a_sweep_publishes_mysql() {
    outbox_release_then_a_sweep_publishes(Backend::Mysql);
}

/// `schema ddl --dialect mysql` prints MySQL's DDL; `schema create` with a mysql:// URL applies
/// it, in a database of its own (the default table names would otherwise collide with other
/// tests'), twice without harm; a missing table names the command that creates it.
#[test]
fn schema_ddl_and_create_on_mysql() {
    let out = acemq(&["schema", "ddl", "--dialect", "mysql"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("`key` VARCHAR(255) PRIMARY KEY"), "{text}");
    assert!(text.contains("ENGINE=InnoDB"), "{text}");
    let _db = Db::mysql(); // fails clearly when MariaDB is not there
    let name = support::unique("acemq_cli_schema").replace(['.', '-'], "_");
    let base = db::mysql_url();
    let base = base.rsplit_once('/').map_or(base.as_str(), |(b, _)| b);
    let mut admin = db::my_client();
    use acemq_amqp::sql::Sql;
    admin
        .execute(&format!("CREATE DATABASE {name}"), &[])
        .unwrap();
    let url = format!("{base}/{name}");
    let out = acemq(&["schema", "create", "--db", &url]);
    let again = acemq(&["schema", "create", "--db", &url]).status.code();
    let tables = admin
        .query(
            &format!(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = '{name}' \
                 ORDER BY 1"
            ),
            &[],
        )
        .unwrap();
    let missing = acemq(&["outbox", "status", "--db", &url, "--table", "not_there"]);
    admin
        .execute(&format!("DROP DATABASE {name}"), &[])
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(again, Some(0));
    let tables: Vec<String> = tables
        .iter()
        .map(|r| r[0].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        tables,
        ["acemq_idempotency", "acemq_outbox", "acemq_schemas"]
    );
    assert_eq!(missing.status.code(), Some(1), "{}", stderr(&missing));
    assert!(
        stderr(&missing).contains("acemq schema create"),
        "{}",
        stderr(&missing)
    );
}

#[test]
fn topology_check_reports_a_planted_difference_and_changes_nothing() {
    let connection = support::connect();
    let mut cleanup = Cleanup::new(&connection);
    let q = support::unique("cli.topo");
    cleanup.consumed_queue(&q, &[Duration::from_secs(40), Duration::from_secs(80)]);
    // What the consumer would declare, except: the 40s rung planted with a 30 s TTL and no
    // dead-letter routing key, the 80s rung missing, `.parked` a quorum queue.
    let t = acemq_amqp::failure_topology(&q, &[Duration::from_secs(40), Duration::from_secs(80)]);
    for e in &t.exchanges {
        connection.declare_exchange(e).unwrap();
    }
    connection
        .declare_queue(&QueueSpec::new(&q).classic())
        .unwrap();
    connection.declare_queue(&t.queues[0]).unwrap();
    connection
        .declare_queue(&QueueSpec::new(acemq_amqp::parked_queue(&q)).quorum())
        .unwrap();
    connection
        .declare_queue(
            &QueueSpec::new(acemq_amqp::retry_queue(&q, Duration::from_secs(40)))
                .classic()
                .message_ttl(Duration::from_secs(30))
                .dead_letter_exchange("acemq.retry"),
        )
        .unwrap();

    let out = acemq(&[
        "--json", "topology", "check", "--queue", &q, "--rung", "40s", "--rung", "80s",
    ]);
    assert_eq!(out.status.code(), Some(1), "differences found: exit 1");
    let lines = json_lines(&out);
    let diffs: Vec<&Value> = lines.iter().filter_map(|l| l.get("difference")).collect();
    let rung40 = acemq_amqp::retry_queue(&q, Duration::from_secs(40));
    let find = |name: &str, what: &str| {
        diffs
            .iter()
            .find(|d| d["name"] == name && d["what"] == what)
            .unwrap_or_else(|| panic!("no difference {what} on {name}: {diffs:?}"))
    };
    let ttl = find(&rung40, "x-message-ttl");
    assert_eq!(
        (ttl["expected"].as_str(), ttl["actual"].as_str()),
        (Some("40000"), Some("30000"))
    );
    let key = find(&rung40, "x-dead-letter-routing-key");
    assert_eq!(
        (key["expected"].as_str(), key["actual"].as_str()),
        (Some(q.as_str()), Some("none"))
    );
    let parked = find(&acemq_amqp::parked_queue(&q), "x-queue-type");
    assert_eq!(parked["actual"], "quorum");
    find(
        &acemq_amqp::retry_queue(&q, Duration::from_secs(80)),
        "existence",
    );
    assert_eq!(diffs.len(), 4, "{diffs:?}");
    assert!(lines
        .iter()
        .any(|l| l["ok"]["name"] == acemq_amqp::dead_letter_queue(&q).as_str()));

    // Nothing was changed: the missing rung is still missing, the planted one still planted.
    assert!(connection
        .queue_info(&acemq_amqp::retry_queue(&q, Duration::from_secs(80)))
        .is_err());
    let again = acemq(&[
        "--json", "topology", "check", "--queue", &q, "--rung", "40s", "--rung", "80s",
    ]);
    assert_eq!(json_lines(&again), lines, "the same report twice");

    // Fixed, it is clean (human output).
    connection.delete_queue(&rung40).unwrap();
    connection
        .delete_queue(&acemq_amqp::parked_queue(&q))
        .unwrap();
    for spec in &t.queues {
        connection.declare_queue(spec).unwrap();
    }
    let out = acemq(&[
        "topology", "check", "--queue", &q, "--rung", "40s", "--rung", "80s",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stdout(&out).contains("0 difference(s)"));
}

#[test]
fn topology_schedule_prints_the_scheduler_topology() {
    let out = acemq(&["--json", "topology", "schedule"]);
    assert_eq!(out.status.code(), Some(0));
    let lines = json_lines(&out);
    assert_eq!(lines[0]["exchange"], "acemq.schedule");
    let due = lines
        .iter()
        .find(|l| l["queue"] == "acemq.schedule.1m")
        .expect("the 1m rung");
    assert_eq!(due["arguments"]["x-message-ttl"], 60_000);
    assert_eq!(
        due["arguments"]["x-dead-letter-routing-key"],
        "acemq.schedule.due"
    );
    assert_eq!(due["type"], "classic");
    assert_eq!(
        lines.iter().filter(|l| l.get("binding").is_some()).count(),
        6
    );
}

#[test]
fn schema_ddl_prints_and_create_applies() {
    for dialect in ["sqlite", "postgres"] {
        let out = acemq(&["schema", "ddl", "--dialect", dialect]);
        assert_eq!(out.status.code(), Some(0));
        let text = stdout(&out);
        assert!(
            text.contains("CREATE TABLE IF NOT EXISTS acemq_outbox"),
            "{text}"
        );
        assert!(text.contains("acemq_idempotency"));
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.db");
    let url = format!("sqlite:{}", path.display());
    let out = acemq(&["schema", "create", "--db", &url]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let n = acemq_tables(&path);
    assert!(n >= 3, "{n} tables");
    // Twice is fine.
    assert_eq!(
        acemq(&["schema", "create", "--db", &url]).status.code(),
        Some(0)
    );
}

#[test]
fn unreachable_broker_or_database_is_exit_3_with_one_line_and_no_password() {
    let secret = "s3cr3t-Pw";
    // Nothing listens there.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let url = format!("amqp://guest:{secret}@127.0.0.1:{port}/%2f");
    // The broker refusing the password.
    let refused = format!("amqp://guest:{secret}@{}/%2f", support::broker_addr());
    for url in [url.as_str(), refused.as_str()] {
        for json in [false, true] {
            let mut args = vec!["--url", url];
            if json {
                args.push("--json");
            }
            args.extend(["peek", "some.queue"]);
            let out = acemq(&args);
            assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
            let err = stderr(&out);
            assert_eq!(err.lines().count(), 1, "one line: {err:?}");
            assert!(err.contains("cannot connect to the broker"), "{err}");
            assert!(!err.contains(secret) && !stdout(&out).contains(secret));
            if json {
                assert_eq!(json_lines(&out)[0]["exit"], 3);
            }
        }
    }
    // ACEMQ_URL is read too, and not printed either.
    let out = Command::new(env!("CARGO_BIN_EXE_acemq"))
        .env("ACEMQ_URL", &url)
        .args(["replay", "orders"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(!stderr(&out).contains(secret));

    // A database that is not there.
    let pg = format!("postgres://postgres:{secret}@127.0.0.1:{port}/test");
    let out = acemq(&["outbox", "status", "--db", &pg]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert_eq!(stderr(&out).lines().count(), 1);
    assert!(stderr(&out).contains("cannot connect to the PostgreSQL database"));
    assert!(!stderr(&out).contains(secret));
    let out = acemq(&["outbox", "status", "--db", "sqlite:/nonexistent/dir/x.db"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
}

#[test]
fn usage_errors_are_exit_2() {
    assert_eq!(acemq(&["peek"]).status.code(), Some(2));
    assert_eq!(
        acemq(&["replay", "q", "--deadline", "soon"]).status.code(),
        Some(2)
    );
    assert_eq!(
        acemq(&["outbox", "status"]).status.code(),
        Some(2),
        "no --db"
    );
    assert_eq!(acemq(&["nonsense"]).status.code(), Some(2));
    let out = acemq(&["outbox", "status", "--db", "oracle://somewhere"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("sqlite:PATH"), "{}", stderr(&out));
    // MySQL is a database `--db` takes: one that cannot be reached is exit 3, not a usage error.
    let out = acemq(&["outbox", "status", "--db", "mysql://root@127.0.0.1:1/test"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot connect to the MySQL database"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn replay_to_another_routing_key_and_a_deadline_that_leaves_messages_behind_is_exit_1() {
    let connection = support::connect();
    let mut cleanup = Cleanup::new(&connection);
    let work = cleanup.consumed_queue(&support::unique("cli.reroute"), &[]);
    let dlq = acemq_amqp::dead_letter_queue(&work);
    let elsewhere = cleanup.queue(&support::unique("cli.elsewhere"));
    for q in [&work, &dlq, &elsewhere] {
        connection
            .declare_queue(&QueueSpec::new(q).classic())
            .unwrap();
    }
    let ids = put(
        &connection,
        &dlq,
        (0..3).map(|i| dead_letter(i, "moved by hand")).collect(),
    );
    // --to-exchange "" --to-routing-key Q: every message goes to Q, not where it came from.
    let out = acemq(&[
        "--json",
        "replay",
        &dlq,
        "--to-exchange",
        "",
        "--to-routing-key",
        &elsewhere,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(json_lines(&out).last().unwrap()["moved"], 3);
    let moved = drain(&connection, &elsewhere);
    assert_eq!(
        moved.iter().map(|m| m.0.as_str()).collect::<Vec<_>>(),
        ids.iter().map(String::as_str).collect::<Vec<_>>()
    );
    assert_eq!(
        count(&connection, &work),
        0,
        "nothing went to the work queue"
    );
    assert_eq!(count(&connection, &dlq), 0);

    // A deadline that passes before the queue is drained: exit 1 ("partial"), and what was
    // not moved is still on the dead-letter queue.
    put(
        &connection,
        &dlq,
        (0..200).map(|i| dead_letter(i, "slow")).collect(),
    );
    let out = acemq(&["--json", "replay", &dlq, "--deadline", "1ms"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let summary = json_lines(&out).last().unwrap().clone();
    assert_eq!(summary["stopped"], "deadline", "{summary}");
    let moved = summary["moved"].as_u64().unwrap();
    assert!(moved < 200, "{summary}");
    assert_eq!(
        u64::from(count(&connection, &dlq)) + moved,
        200,
        "none lost"
    );
    assert_eq!(u64::from(count(&connection, &work)), moved);
}

/// A duration option given a bare number reads it as seconds, and says so in its help: every
/// one of them, `replay --deadline` and `topology check --rung` (issue 48, 12).
#[test]
fn a_bare_number_is_seconds_for_every_duration_option() {
    for args in [&["replay", "--help"][..], &["topology", "check", "--help"]] {
        let help = stdout(&acemq(args));
        assert!(
            help.contains("a bare number is seconds"),
            "{args:?}: {help}"
        );
    }

    // --deadline 5 is five seconds: the summary gives the deadline it ran under.
    let connection = support::connect();
    let mut cleanup = Cleanup::new(&connection);
    let dlq = dead_letter_queue_of(&connection, &mut cleanup, "cli.deadline");
    put(&connection, &dlq, vec![dead_letter(0, "e")]);
    for deadline in ["5", "5s", "5000ms"] {
        let out = acemq(&[
            "--json",
            "replay",
            &dlq,
            "--dry-run",
            "--deadline",
            deadline,
        ]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let summary = json_lines(&out).last().unwrap().clone();
        assert_eq!(
            summary["deadline_ms"], 5000,
            "--deadline {deadline}: {summary}"
        );
        assert_eq!(summary["stopped"], "drained", "{summary}");
        let out = acemq(&["replay", &dlq, "--dry-run", "--deadline", deadline]);
        assert!(
            stdout(&out).contains("; deadline 5s"),
            "--deadline {deadline}: {}",
            stdout(&out)
        );
    }
    let out = acemq(&["--json", "replay", &dlq, "--dry-run"]);
    assert!(json_lines(&out).last().unwrap()["deadline_ms"].is_null());
    assert!(!stdout(&acemq(&["replay", &dlq, "--dry-run"])).contains("; deadline"));
    assert_eq!(count(&connection, &dlq), 1, "dry runs moved nothing");

    // --rung 40 is the 40s rung.
    let q = support::unique("cli.rung-seconds");
    let check = |rung: &str| {
        let out = acemq(&["--json", "topology", "check", "--queue", &q, "--rung", rung]);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        json_lines(&out)
    };
    let bare = check("40");
    let rung = acemq_amqp::retry_queue(&q, Duration::from_secs(40));
    assert!(
        bare.iter()
            .any(|l| l["difference"]["name"] == rung.as_str()),
        "{bare:?}"
    );
    assert_eq!(bare, check("40s"));
}

#[test]
fn acemq_db_is_the_default_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("from-env.db");
    let url = format!("sqlite:{}", path.display());
    let out = acemq_with_db(Some(&url), &["schema", "create"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let n = acemq_tables(&path);
    assert!(n >= 3, "schema create used ACEMQ_DB: {n} tables");
}

#[test]
fn peek_shows_a_slips_position_and_a_claim_checks_key() {
    use acemq_amqp::patterns::routing_slip::RoutingSlip;
    let connection = support::connect();
    let mut cleanup = Cleanup::new(&connection);
    let q = dead_letter_queue_of(&connection, &mut cleanup, "cli.peek-slip");
    let slip = RoutingSlip::new()
        .then("", "validate", "validate")
        .then("", "enrich", "enrich")
        .then("orders", "dispatch", "dispatch")
        .advance();
    let on_a_slip =
        dead_letter(0, "enrich failed").with_header("acemq-routing-slip", slip.to_json());
    let mut claimed = dead_letter(1, "too slow");
    claimed.body = b"\xAC\x01\x01orders/2026/o-1.json".to_vec();
    let ids = put(&connection, &q, vec![on_a_slip, claimed]);

    let out = acemq(&["--json", "peek", &q]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 2);
    let first = &lines[0]["message"];
    assert_eq!(first["id"], ids[0].as_str());
    assert_eq!(first["slip"]["done"], 1, "{first}");
    assert_eq!(first["slip"]["remaining"], 2, "{first}");
    assert_eq!(first["slip"]["next"], "/enrich", "{first}");
    assert!(first["claim_check"].is_null(), "{first}");
    let second = &lines[1]["message"];
    assert_eq!(second["claim_check"], "orders/2026/o-1.json", "{second}");
    assert!(second["slip"].is_null(), "{second}");

    let text = stdout(&acemq(&["peek", &q]));
    assert!(text.contains("claim-check=orders/2026/o-1.json"), "{text}");
    assert_eq!(count(&connection, &q), 2, "peek left both where they were");
}

/// `topology check` with neither `--queue` nor `--schedule` is a usage error that names both
/// (it used to check the scheduler's topology without saying so).
#[test]
fn topology_check_without_arguments_is_a_usage_error_naming_queue_and_schedule() {
    for json in [false, true] {
        let mut args = vec!["topology", "check"];
        if json {
            args.insert(0, "--json");
        }
        let out = acemq(&args);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains("--queue Q") && err.contains("--schedule"),
            "{err}"
        );
        assert!(!stdout(&out).contains("ok   "), "nothing checked");
    }
}

/// `topology check --schedule` compares the broker with the family's scheduler topology, and
/// says so on its first line. The names are shared by every scheduler on the broker, so the
/// test declares them as the family does (harmless when they exist) and leaves them: it can
/// only check the clean case.
#[test]
fn topology_check_schedule_checks_the_scheduler_topology() {
    let connection = support::connect();
    acemq_amqp::patterns::scheduler::schedule_topology()
        .apply(&connection)
        .unwrap();
    let out = acemq(&["--json", "topology", "check", "--schedule"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let lines = json_lines(&out);
    let checked: Vec<&str> = lines
        .iter()
        .filter_map(|l| l["ok"]["name"].as_str())
        .collect();
    for name in [
        "acemq.schedule",
        "acemq.schedule.1h",
        "acemq.schedule.10m",
        "acemq.schedule.1m",
        "acemq.schedule.10s",
        "acemq.schedule.1s",
        "acemq.schedule.due",
    ] {
        assert!(checked.contains(&name), "{name} checked: {checked:?}");
    }
    assert!(
        lines.iter().all(|l| l.get("difference").is_none()),
        "{lines:?}"
    );
    let text = stdout(&acemq(&["topology", "check", "--schedule"]));
    assert!(
        text.lines().next().unwrap_or("").contains("scheduler"),
        "the first line says what is checked: {text}"
    );
    assert!(text.contains("acemq topology schedule"), "{text}");
}

/// `topology check --queue Q` reports Q itself (missing: a difference; present: ok, with its
/// messages and consumers) as well as its failure queues, and no hint about the scheduler.
#[test]
fn topology_check_queue_reports_the_queue_itself_and_no_scheduler_hint() {
    let connection = support::connect();
    let mut cleanup = Cleanup::new(&connection);
    let q = support::unique("cli.topo-self");
    cleanup.consumed_queue(&q, &[]);
    for spec in acemq_amqp::failure_topology(&q, &[]).queues {
        connection.declare_queue(&spec).unwrap();
    }
    // Q itself is not there yet: one difference, its existence.
    let out = acemq(&["--json", "topology", "check", "--queue", &q]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let lines = json_lines(&out);
    let diffs: Vec<&Value> = lines.iter().filter_map(|l| l.get("difference")).collect();
    assert_eq!(diffs.len(), 1, "{diffs:?}");
    assert_eq!(
        (diffs[0]["name"].as_str(), diffs[0]["what"].as_str()),
        (Some(q.as_str()), Some("existence"))
    );
    // Declared, it is reported as there, with the failure queues.
    connection
        .declare_queue(&QueueSpec::new(&q).classic())
        .unwrap();
    let out = acemq(&["--json", "topology", "check", "--queue", &q]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let lines = json_lines(&out);
    let ok: Vec<&str> = lines
        .iter()
        .filter_map(|l| l["ok"]["name"].as_str())
        .collect();
    for name in [
        q.clone(),
        acemq_amqp::dead_letter_queue(&q),
        acemq_amqp::parked_queue(&q),
    ] {
        assert!(ok.contains(&name.as_str()), "{name} reported: {ok:?}");
    }
    let text = stdout(&acemq(&["topology", "check", "--queue", &q]));
    assert!(text.contains(&format!("ok   queue {q} ")), "{text}");
    assert!(
        !text.contains("topology schedule"),
        "no scheduler hint: {text}"
    );
    assert!(!text.contains("scheduler"), "{text}");
}

/// `schema create` on PostgreSQL, in a database of its own (the default table names would
/// otherwise be shared with whatever else uses the test database).
#[test]
fn schema_create_applies_on_postgres() {
    let name = support::unique("acemq_cli_schema").replace(['.', '-'], "_");
    let mut admin = db::pg_client();
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .unwrap();
    let url = format!("host=127.0.0.1 port=5432 user=postgres dbname={name}");
    let out = acemq(&["schema", "create", "--db", &url]);
    let created = out.status.code() == Some(0);
    let tables: Vec<String> = postgres::Client::connect(&url, postgres::NoTls)
        .unwrap()
        .query(
            "SELECT table_name::text FROM information_schema.tables \
             WHERE table_schema = 'public' AND table_name LIKE 'acemq_%' ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    // Twice is fine.
    let again = acemq(&["schema", "create", "--db", &url]).status.code();
    admin
        .batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .unwrap();
    assert!(created, "{}", stderr(&out));
    assert_eq!(again, Some(0));
    for table in ["acemq_outbox", "acemq_idempotency"] {
        assert!(tables.iter().any(|t| t == table), "{table} in {tables:?}");
    }
}

/// The password of the test broker's URL (`guest` on the default one).
fn test_password() -> String {
    let url = support::amqp_url();
    let rest = url.split_once("://").unwrap().1;
    let userinfo = rest.rsplit_once('@').expect("the test URL has a user").0;
    let password = userinfo
        .split_once(':')
        .expect("the test URL has a password")
        .1;
    assert!(!password.is_empty());
    password.to_string()
}

#[test]
fn a_queue_named_with_the_passwords_text_shows_intact_and_a_printed_urls_password_is_masked() {
    let password = test_password();
    let connection = support::connect();
    let mut cleanup = Cleanup::new(&connection);
    // `test.cli.guest_orders.….dlq` on the default broker.
    let q = cleanup.queue(&format!(
        "{}.dlq",
        support::unique(&format!("cli.{password}_orders"))
    ));
    connection
        .declare_queue(&QueueSpec::new(&q).classic())
        .unwrap();
    let error = format!("{password}_orders rejected it");
    put(&connection, &q, vec![dead_letter(0, &error)]);
    for command in [
        &["peek", q.as_str()][..],
        &["replay", q.as_str(), "--dry-run"],
    ] {
        let out = acemq(command);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let text = stdout(&out);
        if command[0] == "replay" {
            // `QUEUE: dry run: would move 1 …` (peek's text lines do not name the queue).
            assert!(text.contains(&format!("{q}: ")), "{text}");
        }
        assert!(text.contains(&error), "{text}");
        assert!(!text.contains("***"), "{text}");
        let mut json = vec!["--json"];
        json.extend_from_slice(command);
        let out = acemq(&json);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let lines = json_lines(&out);
        assert!(stdout(&out).contains(&q), "{}", stdout(&out));
        assert!(!stdout(&out).contains("***"), "{}", stdout(&out));
        let errors: Vec<&str> = lines
            .iter()
            .filter_map(|l| l["error"].as_str().or(l["message"]["error"].as_str()))
            .collect();
        assert_eq!(errors, [error.as_str()], "{}", stdout(&out));
    }
    assert_eq!(count(&connection, &q), 1, "peek and a dry run move nothing");

    // A URL printed (in the connection error) shows its password as ***.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let url = format!("amqp://guest:{password}@127.0.0.1:{port}/%2f");
    for json in [false, true] {
        let mut args = vec!["--url", url.as_str()];
        if json {
            args.push("--json");
        }
        args.extend(["peek", q.as_str()]);
        let out = acemq(&args);
        assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
        let masked = format!("amqp://guest:***@127.0.0.1:{port}/%2f");
        assert!(stderr(&out).contains(&masked), "{}", stderr(&out));
        assert!(!stderr(&out).contains(&format!(":{password}@")));
        if json {
            let line = &json_lines(&out)[0];
            assert!(line["error"].as_str().unwrap().contains(&masked), "{line}");
            assert!(!stdout(&out).contains(&format!(":{password}@")));
        }
    }
}

#[test]
fn usage_errors_with_json_anywhere_are_one_json_object_and_exit_2() {
    let cases: [&[&str]; 6] = [
        &["--json", "peek"],
        &["peek", "--json"],
        &["--json", "nonsense"],
        &["replay", "q", "--deadline", "soon", "--json"],
        &["peek", "q", "--limit", "many", "--json"],
        &["--json", "outbox", "status"],
    ];
    for args in cases {
        let out = acemq(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let lines = json_lines(&out);
        assert_eq!(
            lines.len(),
            1,
            "{args:?}: one JSON object: {}",
            stdout(&out)
        );
        let line = &lines[0];
        assert_eq!(line["kind"], "usage", "{line}");
        assert_eq!(line["exit"], 2, "{line}");
        let error = line["error"].as_str().unwrap();
        assert!(!error.is_empty() && !error.contains('\n'), "{line}");
    }
    // Without --json a usage error stays text for people.
    let out = acemq(&["peek"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stdout(&out).is_empty());
    assert!(stderr(&out).contains("Usage"), "{}", stderr(&out));
    // Help is not an error, with --json or not.
    let out = acemq(&["--json", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("Usage"));
}

#[test]
fn a_url_that_is_not_amqp_or_does_not_parse_is_a_usage_error_exit_2() {
    let secret = "s3cr3t-Pw";
    // The tests' broker, in forms the CLI must refuse before dialing it.
    let broker = support::broker_addr();
    for url in [
        format!("http://guest:{secret}@{broker}/"),
        format!("amqp://guest:{secret}@[::1"),
        broker.clone(),
    ] {
        for json in [false, true] {
            let mut args = vec!["--url", url.as_str()];
            if json {
                args.push("--json");
            }
            args.extend(["peek", "some.queue"]);
            let out = acemq(&args);
            assert_eq!(out.status.code(), Some(2), "{url}: {}", stderr(&out));
            let err = stderr(&out);
            assert_eq!(err.lines().count(), 1, "one line: {err:?}");
            assert!(err.contains("amqp://") && err.contains("amqps://"), "{err}");
            // The CLI cannot use the library's in-process broker: it is not offered (issue 48).
            assert!(!err.contains("memory://"), "{err}");
            assert!(!err.contains("cannot connect"), "{err}");
            assert!(
                !err.contains(secret) && !stdout(&out).contains(secret),
                "{err}"
            );
            if json {
                assert_eq!(json_lines(&out)[0]["kind"], "usage");
            }
        }
    }
    // From ACEMQ_URL too, on every command that connects.
    for args in [&["replay", "orders"][..], &["topology", "check"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_acemq"))
            .env("ACEMQ_URL", format!("http://guest:{secret}@{broker}/"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(!stderr(&out).contains(secret));
    }
}

/// `memory://` is the library's in-process broker: a CLI process would get an empty one of its
/// own, never the application's. Refused as a usage error that says why, from `--url` (before or
/// after the command) and from `ACEMQ_URL` alike (issue 48, 9).
#[test]
fn a_memory_url_is_refused_as_a_usage_error_that_says_why() {
    let q = support::unique("cli.memory");
    let forms: [&[&str]; 3] = [
        &["--url", "memory://orders", "peek", &q],
        &["peek", &q, "--url", "memory://orders"],
        &[
            "topology",
            "check",
            "--queue",
            &q,
            "--url",
            "memory://orders",
        ],
    ];
    for args in forms {
        for json in [false, true] {
            let mut args = args.to_vec();
            if json {
                args.insert(0, "--json");
            }
            let out = acemq(&args);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
            let err = stderr(&out);
            assert_eq!(err.lines().count(), 1, "one line: {err:?}");
            assert!(err.contains("memory://orders"), "{err}");
            assert!(err.contains("in-process broker"), "the reason: {err}");
            assert!(err.contains("amqp://") && err.contains("amqps://"), "{err}");
            assert!(!err.contains("cannot connect"), "{err}");
            if json {
                let line = &json_lines(&out)[0];
                assert_eq!(
                    (line["kind"].as_str(), line["exit"].as_u64()),
                    (Some("usage"), Some(2))
                );
            }
        }
    }
    let out = Command::new(env!("CARGO_BIN_EXE_acemq"))
        .env("ACEMQ_URL", "memory://orders")
        .args(["replay", &q])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("in-process broker"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn help_shows_the_default_url_with_its_password_masked() {
    let cases: [&[&str]; 6] = [
        &["peek", "--help"],
        &["peek", "-h"],
        &["replay", "--help"],
        &["replay", "-h"],
        &["topology", "check", "--help"],
        &["topology", "check", "-h"],
    ];
    for args in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_acemq"))
            .env_remove("ACEMQ_URL")
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0));
        let help = stdout(&out);
        assert!(
            help.contains("amqp://guest:***@127.0.0.1:5672/%2f"),
            "{args:?}: {help}"
        );
        assert!(!help.contains("guest:guest"), "{help}");
    }
    // The exit codes are in the top-level help, and which commands take --url and --db.
    let out = acemq(&["--help"]);
    let help = stdout(&out);
    for code in ["0 ok", "1 partial or failed", "2 usage", "3 cannot connect"] {
        assert!(help.contains(code), "{code}: {help}");
    }
    assert!(
        help.contains("--url") && help.contains("--db") && !help.contains("guest:guest"),
        "{help}"
    );
}

/// Only the commands that talk to the broker (replay, peek, topology check) show and take
/// `--url`: the outbox and schema commands use `--db`, and `topology schedule` nothing (issue
/// 48, 11). `--url` before the command still works for those that do.
#[test]
fn only_the_broker_commands_show_and_take_url() {
    let quiet: [&[&str]; 8] = [
        &["outbox", "--help"],
        &["outbox", "status", "--help"],
        &["outbox", "retired", "--help"],
        &["outbox", "release", "--help"],
        &["schema", "ddl", "--help"],
        &["schema", "create", "--help"],
        &["topology", "schedule", "--help"],
        &["outbox", "status", "-h"],
    ];
    for args in quiet {
        let out = acemq(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(
            !stdout(&out).contains("--url"),
            "{args:?}: {}",
            stdout(&out)
        );
        assert!(
            !stdout(&out).contains("ACEMQ_URL"),
            "{args:?}: {}",
            stdout(&out)
        );
    }
    for args in [
        &["peek", "--help"][..],
        &["replay", "--help"],
        &["topology", "check", "--help"],
    ] {
        let help = stdout(&acemq(args));
        assert!(
            help.contains("--url") && help.contains("ACEMQ_URL"),
            "{args:?}: {help}"
        );
    }

    // Refused on the commands that do not talk to the broker, wherever it is written; the
    // URL's password is not printed.
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("outbox.db").display());
    assert_eq!(
        acemq(&["schema", "create", "--db", &db]).status.code(),
        Some(0)
    );
    let url = format!("amqp://guest:s3cr3t-Pw@{}/%2f", support::broker_addr());
    let url = url.as_str();
    let refused: [&[&str]; 7] = [
        &["outbox", "status", "--db", &db, "--url", url],
        &["outbox", "--url", url, "status", "--db", &db],
        &["--url", url, "outbox", "status", "--db", &db],
        &["--url", url, "outbox", "retired", "--db", &db],
        &["--url", url, "schema", "create", "--db", &db],
        &["--url", url, "schema", "ddl", "--dialect", "sqlite"],
        &["--url", url, "topology", "schedule"],
    ];
    for args in refused {
        for json in [false, true] {
            let mut args = args.to_vec();
            if json {
                args.insert(0, "--json");
            }
            let out = acemq(&args);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
            let err = stderr(&out);
            assert!(err.contains("--url"), "{args:?}: {err}");
            assert!(
                !err.contains("s3cr3t") && !stdout(&out).contains("s3cr3t"),
                "{err}"
            );
            if json {
                assert_eq!(json_lines(&out)[0]["kind"], "usage", "{args:?}");
            }
        }
    }
    let err = stderr(&acemq(&["--url", url, "outbox", "status", "--db", &db]));
    assert!(
        err.contains("does not talk to the broker") && err.contains("--db"),
        "{err}"
    );

    // The broker commands take it before or after the command.
    let connection = support::connect();
    let mut cleanup = Cleanup::new(&connection);
    let q = dead_letter_queue_of(&connection, &mut cleanup, "cli.url-where");
    let good = support::amqp_url();
    let wrong = "amqp://guest:guest@127.0.0.1:1/%2f";
    for args in [
        &["--url", good.as_str(), "peek", q.as_str()][..],
        &["peek", q.as_str(), "--url", good.as_str()],
        &["--url", good.as_str(), "replay", q.as_str(), "--dry-run"],
        &["replay", "--url", good.as_str(), q.as_str(), "--dry-run"],
        &[
            "--url",
            good.as_str(),
            "topology",
            "check",
            "--queue",
            q.as_str(),
        ],
        &[
            "topology",
            "check",
            "--url",
            good.as_str(),
            "--queue",
            q.as_str(),
        ],
    ] {
        // ACEMQ_URL names a port nothing listens on: --url wins over it.
        let out = Command::new(env!("CARGO_BIN_EXE_acemq"))
            .env("ACEMQ_URL", wrong)
            .args(args)
            .output()
            .unwrap();
        assert_ne!(out.status.code(), Some(3), "{args:?}: {}", stderr(&out));
        assert_ne!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    }
}

/// A PostgreSQL server that is not there: the CLI prints why (the I/O error), not only "error
/// connecting to server".
#[test]
fn outbox_status_on_a_closed_postgres_port_prints_the_cause() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let url = format!("host=127.0.0.1 port={port} user=postgres dbname=test");
    let out = acemq(&["outbox", "status", "--db", &url]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(
        err.to_lowercase().contains("connection refused"),
        "the cause: {err}"
    );
}

/// A PostgreSQL database without the outbox table: the server's SQLSTATE and message, and the
/// command that creates the table.
#[test]
fn outbox_status_on_a_missing_postgres_table_prints_the_servers_message_and_schema_create() {
    let db = Db::postgres();
    let table = db.table("no_outbox");
    let out = acemq(&["outbox", "status", "--db", db::PG_URL, "--table", &table]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("42P01"), "the SQLSTATE: {err}");
    assert!(
        err.contains(&format!("relation \"{table}\" does not exist")),
        "{err}"
    );
    assert!(err.contains("acemq schema create"), "{err}");
}

/// `--db sqlite:PATH` naming a file that does not exist, or one without the tables: the CLI says
/// so and gives the command that creates them, and creates no file.
#[test]
fn a_missing_sqlite_database_suggests_schema_create() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing.db");
    let url = format!("sqlite:{}", path.display());
    let out = acemq(&["outbox", "status", "--db", &url]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.contains("does not exist"), "{err}");
    assert!(
        err.contains(&format!("acemq schema create --db {url}")),
        "{err}"
    );
    assert!(!path.exists(), "no file created");

    // A file without the tables.
    let empty = dir.path().join("empty.db");
    rusqlite::Connection::open(&empty)
        .unwrap()
        .execute_batch("CREATE TABLE unrelated (x INTEGER)")
        .unwrap();
    let url = format!("sqlite:{}", empty.display());
    for command in ["status", "retired"] {
        let out = acemq(&["outbox", command, "--db", &url]);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("acemq_outbox"), "{err}");
        assert!(
            err.contains(&format!("acemq schema create --db {url}")),
            "{err}"
        );
    }
}
