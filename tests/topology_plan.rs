//! Topology as a value (issue 51, item 1), on the real broker: a plan changes nothing and says
//! what would be created; apply creates what is missing and then the plan is in sync; a queue
//! that differs is named with each difference, apply refuses and creates nothing, validate
//! fails; a consumed queue brings its failure topology; the file forms (JSON, TOML) and their
//! refusals.

mod support;

use std::time::Duration;

use acemq_amqp::topology::{ApplyMode, PlanAction, Topology};
use acemq_amqp::{
    dead_letter_queue, parked_queue, retry_queue, Binding, Error, ExchangeKind, ExchangeSpec,
    Message, QueueSpec, RetryPolicy,
};
use support::{connect, unique, Cleanup};

/// A consumed queue with a 30 s broker rung, its exchange and a binding.
fn orders(q: &str, x: &str) -> Topology {
    let policy = RetryPolicy::exponential()
        .max_attempts(2)
        .initial_delay(Duration::from_secs(30))
        .max_delay(Duration::from_secs(30));
    Topology::new()
        .exchange(ExchangeSpec::new(x, ExchangeKind::Topic))
        .consumed_queue(QueueSpec::new(q).classic(), &policy)
        .binding(Binding::new().exchange(x).queue(q).routing_key("order.*"))
}

fn cleanup_for(conn: &acemq_amqp::Connection, q: &str, x: &str) -> Cleanup {
    let mut clean = Cleanup::new(conn);
    clean.consumed_queue(q, &[Duration::from_secs(30)]);
    clean.exchange(x);
    clean
}

#[test]
fn a_plan_changes_nothing_and_apply_creates_what_it_said() {
    let conn = connect();
    let (q, x) = (unique("topo-plan"), unique("topo-plan-x"));
    let _clean = cleanup_for(&conn, &q, &x);
    let topology = orders(&q, &x);
    let plan = topology.plan(&conn).unwrap();
    let created: Vec<&str> = plan.to_create().map(|i| i.name.as_str()).collect();
    for name in [
        q.clone(),
        x.clone(),
        dead_letter_queue(&q),
        parked_queue(&q),
        retry_queue(&q, Duration::from_secs(30)),
    ] {
        assert!(created.contains(&name.as_str()), "{name} in {plan}");
    }
    assert!(
        matches!(conn.queue_info(&q), Err(Error::NotFound { .. })),
        "the plan created nothing"
    );
    assert!(!plan.in_sync());
    let text = plan.to_string();
    assert!(text.contains(&format!("create   queue {q}")), "{text}");
    assert!(text.contains("bind     "), "{text}");

    topology.apply(&conn, ApplyMode::Apply).unwrap();
    let again = topology.plan(&conn).unwrap();
    assert!(again.in_sync(), "{again}");
    assert!(again
        .items
        .iter()
        .filter(|i| i.kind != "binding")
        .all(|i| i.action == PlanAction::Present));
    topology.validate(&conn).unwrap();
    // The binding works: a message to the exchange reaches the queue.
    conn.publisher()
        .unwrap()
        .publish(&x, "order.placed", Message::new("o-1"))
        .unwrap();
    assert!(support::eventually(Duration::from_secs(10), || conn
        .queue_info(&q)
        .map(|i| i.message_count == 1)
        .unwrap_or(false)));
}

#[test]
fn a_queue_that_differs_is_named_apply_refuses_creating_nothing_and_validate_fails() {
    let conn = connect();
    let (q, x) = (unique("topo-drift"), unique("topo-drift-x"));
    let _clean = cleanup_for(&conn, &q, &x);
    // Someone declared the queue with a TTL the topology does not have.
    conn.declare_queue(
        &QueueSpec::new(&q)
            .classic()
            .message_ttl(Duration::from_secs(5)),
    )
    .unwrap();
    let topology = orders(&q, &x);
    let plan = topology.plan(&conn).unwrap();
    let drifted: Vec<_> = plan.conflicts().collect();
    assert_eq!(drifted.len(), 1, "{plan}");
    assert_eq!(drifted[0].name, q);
    let PlanAction::Differs(d) = &drifted[0].action else {
        unreachable!()
    };
    assert_eq!(d[0].what, "x-message-ttl", "{d:?}");
    assert!(plan.to_string().contains("DIFFERS  queue"), "{plan}");

    let e = topology.apply(&conn, ApplyMode::Apply).unwrap_err();
    let Error::TopologyConflict { name, reason, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(name, &q);
    assert!(reason.contains("x-message-ttl"), "{reason}");
    assert!(
        matches!(
            conn.queue_info(&dead_letter_queue(&q)),
            Err(Error::NotFound { .. })
        ),
        "nothing created after a refusal"
    );
    let e = topology.validate(&conn).unwrap_err();
    assert!(e.to_string().contains("drifted"), "{e}");
    assert!(
        e.to_string().contains("is missing"),
        "the missing ones listed too: {e}"
    );
}

#[test]
fn validate_fails_on_a_missing_exchange_and_plan_mode_changes_nothing() {
    let conn = connect();
    let x = unique("topo-missing-x");
    let mut clean = Cleanup::new(&conn);
    clean.exchange(&x);
    let topology = Topology::new().exchange(ExchangeSpec::new(&x, ExchangeKind::Fanout));
    let e = topology.validate(&conn).unwrap_err();
    assert!(
        e.to_string()
            .contains(&format!("exchange {x:?} is missing")),
        "{e}"
    );
    let plan = topology.apply(&conn, ApplyMode::Plan).unwrap();
    assert_eq!(plan.to_create().count(), 1);
    assert!(
        topology.validate(&conn).is_err(),
        "plan mode created nothing"
    );
}

#[test]
fn the_file_forms_read_the_same_topology_and_refuse_what_they_do_not_know() {
    let json = r#"{
        "exchanges": [{"name": "shop", "type": "topic"}],
        "queues": [
            {"name": "shop.orders", "type": "classic", "retry": {"kind": "exponential",
             "max_attempts": 3, "initial_delay": "30s", "max_delay": "1m"}},
            {"name": "shop.audit", "dead_letter": true, "arguments": {"x-max-length": 1000}}
        ],
        "bindings": [{"exchange": "shop", "queue": "shop.orders", "routing_key": "order.*"}],
        "scheduler": {"base": "shop.schedule", "rungs": ["1s", "1m"]}
    }"#;
    let t = Topology::from_json_str(json).unwrap();
    let names: Vec<&str> = t.queues().iter().map(|q| q.name()).collect();
    for expected in [
        "shop.orders",
        "shop.orders.dlq",
        "shop.orders.parked",
        "shop.orders.retry.30s",
        "shop.orders.retry.1m",
        "shop.audit",
        "shop.audit.dlq",
        "shop.schedule.due",
        "shop.schedule.1m",
    ] {
        assert!(names.contains(&expected), "{expected} in {names:?}");
    }
    assert_eq!(
        names
            .iter()
            .filter(|n| n.starts_with("shop.audit.retry"))
            .count(),
        0,
        "dead_letter alone has no rungs"
    );
    let toml = r#"
        [[exchanges]]
        name = "shop"
        type = "topic"

        [[queues]]
        name = "shop.orders"
        type = "classic"
        retry = { kind = "exponential", max_attempts = 3, initial_delay = "30s", max_delay = "1m" }

        [[queues]]
        name = "shop.audit"
        dead_letter = true
        arguments = { "x-max-length" = 1000 }

        [[bindings]]
        exchange = "shop"
        queue = "shop.orders"
        routing_key = "order.*"

        [scheduler]
        base = "shop.schedule"
        rungs = ["1s", "1m"]
    "#;
    let from_toml = Topology::from_toml_str(toml).unwrap();
    assert_eq!(from_toml.queues(), t.queues());
    assert_eq!(from_toml.exchanges(), t.exchanges());
    assert_eq!(from_toml.bindings(), t.bindings());

    let e = Topology::from_json_str(r#"{"queues": [{"name": "q", "ttl": "5s"}]}"#).unwrap_err();
    assert!(e.to_string().contains("unknown field `ttl`"), "{e}");
    let e = Topology::from_json_str(r#"{"queues": [{"name": "q", "message_ttl": "soon"}]}"#)
        .unwrap_err();
    assert!(e.to_string().contains("queues[q].message_ttl"), "{e}");
    let e = Topology::from_json_str(r#"{"queues": [{"name": "q", "type": "lazy"}]}"#).unwrap_err();
    assert!(e.to_string().contains("quorum, classic or stream"), "{e}");
}
