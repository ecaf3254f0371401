//! The scheduler on the real broker: the topology read back matches the family's vector,
//! another client's identical topology (32-bit TTLs) is accepted, other arguments are a
//! conflict that leaves the connection usable; the hop arithmetic; a 3 s delay via the 1 s
//! rung; a multi-hop delivery on a short ladder; a due message with no queue kept until one is
//! bound; a foreign control message rejected; a scheduler killed mid-hop loses nothing.

mod support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use acemq_amqp::patterns::scheduler::{
    hop_plan, hop_plan_on, schedule_topology, RunningScheduler, Scheduler, SchedulerOptions,
};
use acemq_amqp::{headers, Binding, Connection, Error, HeaderValue, Message, QueueSpec};
use amiquip::{AmqpProperties, AmqpValue, FieldTable};
use serde_json::Value;
use support::raw::Raw;
use support::{connect, eventually, rabbitmqctl, unique, Cleanup};

const WAIT: Duration = Duration::from_secs(40);

/// The family's scheduler topology vector (`fixtures/schedule_topology.json`).
fn vector() -> Value {
    serde_json::from_str(include_str!("fixtures/schedule_topology.json")).unwrap()
}

/// Registers a scheduler's queues and exchange (base name, rung suffixes) for clean-up.
fn clean_scheduler(clean: &mut Cleanup, base: &str, suffixes: &[&str]) {
    for s in suffixes {
        clean.queue(&format!("{base}.{s}"));
    }
    clean.queue(&format!("{base}.due"));
    clean.exchange(base);
}

/// A connection, its clean-up, and a scheduler base of the test's own named after `prefix`, its
/// rungs (`suffixes`), due queue and exchange cleaned up.
fn scheduler_base(prefix: &str, suffixes: &[&str]) -> (Connection, Cleanup, String) {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let base = unique(prefix);
    clean_scheduler(&mut clean, &base, suffixes);
    (conn, clean, base)
}

/// A classic queue of the test's own named after `prefix`, declared on `conn`, cleaned up.
fn destination(conn: &Connection, clean: &mut Cleanup, prefix: &str) -> String {
    let q = clean.queue(&unique(prefix));
    conn.declare_queue(&QueueSpec::new(&q).classic()).unwrap();
    q
}

/// `m` addressed as a scheduler's control message: for `q` through the default exchange, due
/// at `due_at`.
fn addressed(m: Message, q: &str, due_at: impl Into<HeaderValue>) -> Message {
    m.with_header(headers::SCHEDULE_EXCHANGE, "")
        .with_header(headers::SCHEDULE_ROUTING_KEY, q)
        .with_header(headers::SCHEDULE_DUE_AT, due_at)
}

/// A scheduler on `conn` with `options`, started.
fn start_scheduler(conn: &Connection, options: SchedulerOptions) -> RunningScheduler {
    Scheduler::new(conn, options)
        .and_then(Scheduler::start)
        .unwrap()
}

/// The scheduler options of `base` with the rungs `rungs` (in seconds).
fn on_rungs(base: &str, rungs: &[u64]) -> SchedulerOptions {
    SchedulerOptions::new()
        .base(base)
        .rungs(rungs.iter().map(|s| Duration::from_secs(*s)))
}

const FAMILY: [&str; 5] = ["1h", "10m", "1m", "10s", "1s"];

/// A rung's suffix (`1h`, `10m`, `1s`) as its duration.
fn dur(s: &str) -> Duration {
    let (n, unit) = s.split_at(s.len() - 1);
    let n: u64 = n.parse().unwrap();
    Duration::from_secs(match unit {
        "h" => n * 3600,
        "m" => n * 60,
        _ => n,
    })
}

#[test]
fn the_hop_plan_matches_the_vector() {
    for example in vector()["hops_examples"].as_array().unwrap() {
        let delay = Duration::from_millis(example["delay_ms"].as_u64().unwrap());
        let plan = hop_plan(delay);
        if let Some(hops) = example["hops"].as_array() {
            let want: Vec<Duration> = hops.iter().map(|h| dur(h.as_str().unwrap())).collect();
            assert_eq!(plan, want, "{example}");
        }
        if let Some(n) = example["hops_count"].as_u64() {
            assert_eq!(plan.len() as u64, n, "{example}");
        }
    }
    // 90 s: one minute, then three times ten seconds.
    let s = Duration::from_secs;
    assert_eq!(hop_plan(s(90)), vec![s(60), s(10), s(10), s(10)]);
    assert!(hop_plan(Duration::from_millis(400)).is_empty());
    assert_eq!(hop_plan(Duration::from_millis(999)), vec![s(1)]);
    assert_eq!(
        hop_plan_on(&[s(1), s(4)], s(7)),
        vec![s(4), s(1), s(1), s(1)]
    );
}

#[test]
fn the_topology_read_back_from_the_broker_matches_the_vector_argument_for_argument() {
    let conn = connect();
    let v = vector();
    // The function itself.
    let t = schedule_topology();
    assert_eq!(t.exchange.name(), "acemq.schedule");
    assert_eq!(t.queues.len(), 6);
    assert_eq!(t.bindings.len(), 6);

    let scheduler = start_scheduler(&conn, SchedulerOptions::default());
    // Read back with rabbitmqctl: every rung with exactly three arguments.
    let listing: Value = serde_json::from_str(&rabbitmqctl(&[
        "list_queues",
        "-q",
        "name",
        "durable",
        "arguments",
        "--formatter",
        "json",
    ]))
    .unwrap();
    let queue = |name: &str| {
        listing
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["name"] == name)
            .unwrap_or_else(|| panic!("{name} not on the broker"))
            .clone()
    };
    for (name, ttl) in v["rungs_ms"].as_object().unwrap() {
        let q = queue(name);
        assert_eq!(q["durable"], true, "{name}");
        let mut want = v["rung_arguments_besides_ttl"].clone();
        want["x-message-ttl"] = ttl.clone();
        assert_eq!(arguments(&q), as_listed(want), "{name}: {q}");
    }
    let control = queue(v["control_queue"]["name"].as_str().unwrap());
    assert_eq!(
        arguments(&control),
        as_listed(v["control_queue"]["arguments"].clone()),
        "{control}"
    );
    assert_eq!(control["durable"], true);

    let exchanges: Value = serde_json::from_str(&rabbitmqctl(&[
        "list_exchanges",
        "-q",
        "name",
        "type",
        "durable",
        "--formatter",
        "json",
    ]))
    .unwrap();
    let x = exchanges
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == "acemq.schedule")
        .expect("the exchange");
    assert_eq!(x["type"], v["exchange"]["type"]);
    assert_eq!(x["durable"], v["exchange"]["durable"]);

    let bindings: Value = serde_json::from_str(&rabbitmqctl(&[
        "list_bindings",
        "-q",
        "source_name",
        "destination_name",
        "routing_key",
        "--formatter",
        "json",
    ]))
    .unwrap();
    let mut names: Vec<String> = v["rungs_ms"].as_object().unwrap().keys().cloned().collect();
    names.push("acemq.schedule.due".into());
    for name in names {
        assert!(
            bindings
                .as_array()
                .unwrap()
                .iter()
                .any(|b| b["source_name"] == "acemq.schedule"
                    && b["destination_name"] == name.as_str()
                    && b["routing_key"] == name.as_str()),
            "{name} is bound under its own name"
        );
    }
    scheduler.close().unwrap();
    // Clean up the family's names too (no other test here uses them).
    for name in v["rungs_ms"].as_object().unwrap().keys() {
        conn.delete_queue(name).unwrap();
    }
    conn.delete_queue("acemq.schedule.due").unwrap();
    conn.delete_exchange("acemq.schedule").unwrap();
}

/// A queue's arguments as `rabbitmqctl` lists them (`[name, type, value]` triples) as an object;
/// text arguments must be long strings. A classic queue's `x-queue-type` is checked to be
/// `classic` and left out: this library declares it (so that a vhost whose default type is
/// quorum keeps the queue classic), the family's vector leaves it off, and RabbitMQ 3.x and 4.x
/// take the two as one declaration — 3.x lists the argument as it was first declared, 4.x always
/// lists the type.
fn arguments(queue: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for triple in queue["arguments"].as_array().unwrap() {
        let name = triple[0].as_str().unwrap();
        if triple[2].is_string() {
            assert_eq!(triple[1], "longstr", "{name}");
        }
        if name == "x-queue-type" {
            assert_eq!(triple[2], "classic", "{queue}");
            continue;
        }
        out.insert(name.to_string(), triple[2].clone());
    }
    Value::Object(out)
}

/// The arguments the family's vector gives a queue (a classic queue's `x-queue-type` left off,
/// as [`arguments`] reads the broker's).
fn as_listed(mut vector_arguments: Value) -> Value {
    if let Some(map) = vector_arguments.as_object_mut() {
        if map.get("x-queue-type").and_then(Value::as_str) == Some("classic") {
            map.remove("x-queue-type");
        }
    }
    vector_arguments
}

/// Declares a scheduler topology with raw amiquip, as another library would; `ttl` writes each
/// rung's TTL.
fn raw_topology(raw: &Raw, base: &str, rungs: &[Duration], ttl: impl Fn(u64) -> AmqpValue) {
    raw.declare_exchange(base);
    for r in rungs {
        let name = format!("{base}.{}", rung_suffix(*r));
        let mut args = FieldTable::new();
        args.insert("x-message-ttl".into(), ttl(r.as_millis() as u64));
        args.insert(
            "x-dead-letter-exchange".into(),
            AmqpValue::LongString(base.into()),
        );
        args.insert(
            "x-dead-letter-routing-key".into(),
            AmqpValue::LongString(format!("{base}.due")),
        );
        raw.declare_queue(&name, args).unwrap();
        raw.bind(&name, base, &name);
    }
    raw.declare_queue(&format!("{base}.due"), FieldTable::new())
        .unwrap();
    raw.bind(&format!("{base}.due"), base, &format!("{base}.due"));
}

/// A rung's duration as its queue's suffix (`1h`, `10m`, `1s`).
fn rung_suffix(d: Duration) -> String {
    let s = d.as_secs();
    if s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

#[test]
fn a_topology_another_client_declared_with_32_bit_ttls_is_accepted() {
    let (conn, _clean, base) = scheduler_base("sched-foreign", &FAMILY);
    let raw = Raw::open();
    let rungs: Vec<Duration> = FAMILY.iter().map(|s| dur(s)).collect();
    raw_topology(&raw, &base, &rungs, |ms| AmqpValue::LongInt(ms as i32));
    raw.close();
    let scheduler = start_scheduler(&conn, SchedulerOptions::new().base(&base));
    scheduler.close().unwrap();
}

#[test]
fn a_rung_with_other_arguments_is_a_topology_conflict_and_the_connection_stays_usable() {
    let (conn, mut clean, base) = scheduler_base("sched-conflict", &FAMILY);
    let raw = Raw::open();
    let mut args = FieldTable::new();
    args.insert("x-message-ttl".into(), AmqpValue::LongInt(9_999));
    raw.declare_queue(&format!("{base}.10s"), args).unwrap();
    raw.close();

    let err = Scheduler::new(&conn, SchedulerOptions::new().base(&base))
        .and_then(Scheduler::start)
        .unwrap_err();
    match &err {
        Error::TopologyConflict { kind, name, reason } => {
            assert_eq!(*kind, "queue");
            assert_eq!(name, &format!("{base}.10s"));
            assert!(reason.contains("PRECONDITION_FAILED"), "{reason}");
        }
        other => panic!("expected a conflict, got {other}"),
    }
    // The connection still works.
    let q = destination(&conn, &mut clean, "sched-after-conflict");
    let p = conn.publisher().unwrap();
    p.publish("", &q, Message::new("still here")).unwrap();
    p.close().unwrap();
    support::wait_for_count(&conn, &q, 1, WAIT);
}

/// Polls `queue` with a raw client of its own (within `WAIT`) until a message arrives; its
/// properties and body, and when it was taken. Fails the test, saying `what`, if none comes.
fn receive_one(queue: &str, what: &str) -> (AmqpProperties, Vec<u8>, Instant) {
    let raw = Raw::open();
    let (props, body) = receive(&raw, queue, WAIT).unwrap_or_else(|| panic!("{what}"));
    let at = Instant::now();
    raw.close();
    (props, body, at)
}

/// Polls `queue` with a raw client until a message arrives.
fn receive(raw: &Raw, queue: &str, within: Duration) -> Option<(AmqpProperties, Vec<u8>)> {
    let mut got = None;
    eventually(within, || {
        got = raw.get(queue).map(|(p, _, b)| (p, b));
        got.is_some()
    });
    got
}

/// The header `name` of raw properties, if present.
fn header<'a>(props: &'a AmqpProperties, name: &str) -> Option<&'a AmqpValue> {
    props.headers().as_ref().and_then(|h| h.get(name))
}

#[test]
fn a_3s_delay_arrives_after_about_3s_via_the_1s_rung_with_a_fresh_envelope() {
    let (conn, mut clean, base) = scheduler_base("sched-3s", &FAMILY);
    let q = destination(&conn, &mut clean, "sched-3s-dest");
    let scheduler = start_scheduler(&conn, SchedulerOptions::new().base(&base));

    let message = Message::new(r#"{"invoice":7}"#)
        .with_content_type("application/json")
        .with_header("tenant", "t-1");
    let id = message.id().to_string();
    let started = Instant::now();
    scheduler
        .after(Duration::from_secs(3), "", &q, message)
        .unwrap();
    assert_eq!(scheduler.scheduled(), 1);
    let (props, body, at) = receive_one(&q, "delivered");
    let elapsed = at - started;
    // Within half a second of the due time, plus the hops' own time.
    assert!(
        elapsed >= Duration::from_millis(2_500) && elapsed < Duration::from_secs(5),
        "{elapsed:?}"
    );
    assert_eq!(body, br#"{"invoice":7}"#, "the bytes as scheduled");
    assert_eq!(props.content_type().as_deref(), Some("application/json"));
    assert_eq!(props.message_id().as_deref(), Some(id.as_str()));
    assert_eq!(
        header(&props, headers::TYPE),
        Some(&AmqpValue::LongString("ScheduledMessage".into()))
    );
    assert_eq!(
        header(&props, headers::ATTEMPT),
        Some(&AmqpValue::LongInt(1))
    );
    assert_eq!(
        header(&props, "tenant"),
        Some(&AmqpValue::LongString("t-1".into())),
        "application headers go with it"
    );
    for h in support::SCHEDULE_ONLY_HEADERS {
        assert!(header(&props, h).is_none(), "{h} is not passed on");
    }
    assert!(eventually(WAIT, || scheduler.delivered() == 1));
    assert!(
        scheduler.hops() >= 2,
        "waited on the 1 s rung: {}",
        scheduler.hops()
    );
    scheduler.close().unwrap();
}

#[test]
fn a_multi_hop_delivery_on_a_short_ladder() {
    let (conn, mut clean, base) = scheduler_base("sched-ladder", &["4s", "2s", "1s"]);
    let q = destination(&conn, &mut clean, "sched-ladder-dest");
    let scheduler = start_scheduler(&conn, on_rungs(&base, &[4, 2, 1]));
    let started = Instant::now();
    scheduler
        .at(
            time::OffsetDateTime::now_utc() + time::Duration::seconds(7),
            "",
            &q,
            Message::new("bytes").with_content_type("text/plain"),
        )
        .unwrap();
    let (props, body, at) = receive_one(&q, "delivered");
    let elapsed = at - started;
    assert_eq!(body, b"bytes");
    assert_eq!(props.content_type().as_deref(), Some("text/plain"));
    assert!(
        elapsed >= Duration::from_millis(6_500) && elapsed < Duration::from_secs(10),
        "{elapsed:?}"
    );
    // 4 s, 2 s, 1 s, then delivered. The scheduler counts the delivery once the broker has
    // confirmed it, which may come after the message reached the destination's reader.
    assert!(
        eventually(WAIT, || scheduler.delivered() == 1),
        "delivered: {}",
        scheduler.delivered()
    );
    assert_eq!(scheduler.hops(), 3);
    scheduler.close().unwrap();
}

#[test]
fn a_due_message_with_no_bound_queue_is_kept_and_delivered_once_a_queue_is_bound() {
    let (conn, mut clean, base) = scheduler_base("sched-keep", &["2s", "1s"]);
    let x = clean.exchange(&unique("sched-keep-x"));
    conn.declare_exchange(&acemq_amqp::ExchangeSpec::direct(&x))
        .unwrap();
    let scheduler = start_scheduler(&conn, on_rungs(&base, &[2, 1]));
    scheduler
        .after(Duration::ZERO, &x, "invoices", Message::new("kept"))
        .unwrap();
    // Kept on the rung nearest 10 s (2 s here), came back, kept again.
    assert!(
        eventually(WAIT, || scheduler.hops() >= 2),
        "{}",
        scheduler.hops()
    );
    assert_eq!(scheduler.delivered(), 0);
    let q = destination(&conn, &mut clean, "sched-keep-dest");
    conn.bind(
        &Binding::new()
            .queue(&q)
            .exchange(&x)
            .routing_key("invoices"),
    )
    .unwrap();
    let (_, body, _) = receive_one(&q, "delivered once bound");
    assert_eq!(body, b"kept");
    assert!(eventually(WAIT, || scheduler.delivered() == 1));
    scheduler.close().unwrap();
}

#[test]
fn a_control_message_without_the_scheduler_headers_is_rejected_not_retried() {
    let (conn, mut clean, base) = scheduler_base("sched-foreign-msg", &["1s"]);
    let q = destination(&conn, &mut clean, "sched-foreign-dest");
    let scheduler = start_scheduler(&conn, on_rungs(&base, &[1]));
    let p = conn.publisher().unwrap();
    let due = format!("{base}.due");
    p.publish("", &due, Message::new("not scheduled")).unwrap();
    // Unreadable due time.
    let bad = addressed(Message::new("bad due"), &q, HeaderValue::Bool(true));
    p.publish("", &due, bad).unwrap();
    // A well-formed one, as another library writes it (due at as decimal text even).
    p.publish("", &due, addressed(Message::new("good"), &q, "0"))
        .unwrap();
    p.close().unwrap();
    let (props, body, _) = receive_one(&q, "the good one");
    assert_eq!(body, b"good");
    assert_eq!(props.content_type().as_deref(), Some("application/json"));
    assert!(eventually(WAIT, || scheduler.rejected() == 2));
    support::wait_for_count(&conn, &format!("{base}.due"), 0, WAIT);
    assert_eq!(scheduler.rejected(), 2, "rejected once each, not retried");
    scheduler.close().unwrap();
}

/// Runs in a child process (see `a_scheduler_killed_mid_hop_loses_nothing`): a scheduler on the
/// base in `ACEMQ_SCHED_BASE` until killed.
#[test]
#[ignore = "run as a child process by the crash test"]
fn scheduler_child() {
    let Ok(base) = std::env::var("ACEMQ_SCHED_BASE") else {
        return;
    };
    let conn = connect();
    let _scheduler = start_scheduler(&conn, on_rungs(&base, &[1]));
    println!("child scheduler running");
    // Killed by the parent long before this.
    std::thread::sleep(Duration::from_secs(120));
}

#[test]
fn a_scheduler_killed_mid_hop_loses_nothing() {
    let (conn, mut clean, base) = scheduler_base("sched-crash", &["1s"]);
    let q = destination(&conn, &mut clean, "sched-crash-dest");
    let options = on_rungs(&base, &[1]);
    options.topology().apply(&conn).unwrap();

    // 60 scheduled messages on the 1 s rung, due 2 to 7 s from now, as any scheduler writes them.
    let p = conn.publisher().unwrap();
    let now = acemq_amqp::now_ms();
    let mut ids = HashSet::new();
    for i in 0..60i64 {
        let m = Message::new(format!("m{i}")).with_type("ScheduledMessage");
        let m = addressed(m, &q, now + 2_000 + i * 80)
            .with_header(headers::SCHEDULE_CONTENT_TYPE, "text/plain");
        ids.insert(m.id().to_string());
        p.publish(&base, &format!("{base}.1s"), m).unwrap();
    }
    p.close().unwrap();

    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "scheduler_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("ACEMQ_SCHED_BASE", &base)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Killed while it is moving them: some delivered, most still hopping.
    let delivered = |c: &Connection| c.queue_info(&q).map(|i| i.message_count).unwrap_or(0);
    let started = eventually(WAIT, || delivered(&conn) >= 5);
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(started, "the child scheduler delivered nothing");
    let at_kill = delivered(&conn);
    assert!(at_kill < 60, "killed too late to be mid-hop: {at_kill}");

    // Another scheduler takes over: every message arrives (a duplicate is allowed, a loss not).
    let scheduler = start_scheduler(&conn, options);
    let raw = Raw::open();
    let mut seen = HashSet::new();
    let deadline = Instant::now() + WAIT;
    while seen.len() < ids.len() && Instant::now() < deadline {
        match raw.get(&q) {
            Some((props, _, _)) => {
                seen.insert(props.message_id().clone().unwrap());
            }
            None => {
                eventually(Duration::from_secs(1), || delivered(&conn) > 0);
            }
        }
    }
    raw.close();
    scheduler.close().unwrap();
    assert_eq!(seen, ids, "{} of 60 arrived", seen.len());
}

/// Two schedulers (two services, say) on one broker share the topology and the work: each
/// declares the same ladder, both consume the one control queue, and every message scheduled
/// through either is delivered exactly once.
#[test]
fn two_schedulers_share_the_topology_and_the_work_and_deliver_each_message_once() {
    let (conn_a, mut clean, base) = scheduler_base("sched-shared", &["2s", "1s"]);
    let conn_b = connect();
    let q = destination(&conn_a, &mut clean, "sched-shared-dest");
    let a = start_scheduler(&conn_a, on_rungs(&base, &[2, 1]));
    let b = start_scheduler(&conn_b, on_rungs(&base, &[2, 1]));
    let mut sent = HashSet::new();
    for i in 0..40 {
        let by = if i % 2 == 0 { &a } else { &b };
        let m = Message::new(format!("{i}")).with_content_type("text/plain");
        sent.insert(format!("{i}"));
        by.after(Duration::from_millis(2_500), "", &q, m).unwrap();
    }
    let raw = Raw::open();
    let mut got = Vec::new();
    while got.len() < 40 {
        let Some((_, body)) = receive(&raw, &q, WAIT) else {
            break;
        };
        got.push(String::from_utf8(body).unwrap());
    }
    // Nothing more comes: a second delivery of any of them would show up here.
    assert!(
        receive(&raw, &q, Duration::from_secs(2)).is_none(),
        "a message came twice"
    );
    raw.close();
    assert_eq!(got.len(), 40, "every message arrived");
    assert_eq!(
        got.iter().cloned().collect::<HashSet<_>>(),
        sent,
        "each exactly once"
    );
    assert_eq!(a.delivered() + b.delivered(), 40);
    assert!(
        a.delivered() + a.hops() > 0 && b.delivered() + b.hops() > 0,
        "both took part: a {} delivered / {} hops, b {} / {}",
        a.delivered(),
        a.hops(),
        b.delivered(),
        b.hops()
    );
    a.close().unwrap();
    b.close().unwrap();
}
