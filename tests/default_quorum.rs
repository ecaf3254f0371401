//! A vhost whose default queue type is quorum (`rabbitmqctl add_vhost --default-queue-type
//! quorum`, as some hosted RabbitMQ offerings set up; issue 46): everything the library declares
//! as classic stays classic there (`.dlq`, `.parked`, retry rungs, transient reply queues), the
//! patterns work, and nothing is lost. And the explicit `x-queue-type: classic` the library
//! sends is, for RabbitMQ 3.x and 4.x alike, one declaration with the family's (which sends
//! none), so two services declaring one queue still agree.

mod support;

use std::time::Duration;

use acemq_amqp::patterns::peek::peek;
use acemq_amqp::patterns::request_reply::{Responder, ResponderOptions};
use acemq_amqp::{
    dead_letter_queue, parked_queue, BoxError, Connection, ConsumerOptions, Message, Outcome,
    QueueSpec, RetryPolicy,
};
use support::{connect, connect_with, eventually, rabbitmqctl, unique, Cleanup};

const WAIT: Duration = Duration::from_secs(30);

/// A vhost of its own with quorum as the default queue type, the guest user allowed on it;
/// deleted (with everything in it) on drop.
struct QuorumVhost(String);

impl QuorumVhost {
    fn new() -> QuorumVhost {
        let name = unique("quorum-vhost");
        rabbitmqctl(&["add_vhost", &name, "--default-queue-type", "quorum"]);
        let vhost = QuorumVhost(name);
        rabbitmqctl(&["set_permissions", "-p", &vhost.0, "guest", ".*", ".*", ".*"]);
        vhost
    }

    fn connect(&self) -> Connection {
        let url = format!("amqp://guest:guest@{}/{}", support::broker_addr(), self.0);
        connect_with(acemq_amqp::ConnectionOptions::new().address(url))
    }

    /// `name type` of every queue in the vhost.
    fn queue_types(&self) -> std::collections::BTreeMap<String, String> {
        rabbitmqctl(&[
            "list_queues",
            "-p",
            &self.0,
            "name",
            "type",
            "--quiet",
            "--no-table-headers",
        ])
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?.to_string(), f.next()?.to_string()))
        })
        .collect()
    }
}

impl Drop for QuorumVhost {
    fn drop(&mut self) {
        let _ = support::rabbitmqctl_command()
            .args(["delete_vhost", &self.0])
            .output();
    }
}

#[test]
fn on_a_default_quorum_vhost_failure_queues_and_rungs_stay_classic_and_nothing_is_lost() {
    let vhost = QuorumVhost::new();
    let conn = vhost.connect();
    let q = unique("dq-work");
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    // A policy with a broker rung (60 s, over the 30 s threshold): the consumer declares it.
    let policy = RetryPolicy::fixed(2, Duration::from_secs(60));
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().retry(policy))
        .unwrap()
        .start(|m: &Message| {
            if m.body == b"bad" {
                Ok(Outcome::reject("it can never succeed"))
            } else {
                Ok(Outcome::Accept)
            }
        })
        .unwrap();
    let publisher = conn.publisher().unwrap();
    publisher.publish("", &q, Message::new("good")).unwrap();
    let bad = Message::new("bad");
    let bad_id = bad.id().to_string();
    publisher.publish("", &q, bad).unwrap();
    let dlq = dead_letter_queue(&q);
    assert!(
        eventually(WAIT, || conn
            .queue_info(&dlq)
            .is_ok_and(|i| i.message_count == 1)),
        "the rejected message reached {dlq}"
    );
    let types = vhost.queue_types();
    assert_eq!(
        types.get(&q).map(String::as_str),
        Some("quorum"),
        "{types:?}"
    );
    for classic in [dlq.clone(), parked_queue(&q), format!("{q}.retry.1m")] {
        assert_eq!(
            types.get(&classic).map(String::as_str),
            Some("classic"),
            "{classic} in {types:?}"
        );
    }
    // The `.dlq` is classic, so the ordered peek reads it, as often as a person likes.
    for _ in 0..3 {
        let seen = peek(&conn, &dlq, 10).expect("peek the .dlq");
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].id(), bad_id);
        assert!(seen[0].failure_reason().unwrap().contains("never succeed"));
    }
    consumer.close().unwrap();
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 0);
    publisher.close().unwrap();
    conn.close().unwrap();
}

#[test]
fn on_a_default_quorum_vhost_request_reply_gets_its_reply() {
    let vhost = QuorumVhost::new();
    let conn = vhost.connect();
    let q = unique("dq-rr");
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let responder = Responder::new(&conn, &q, ResponderOptions::new())
        .and_then(|r| r.start(|m: &Message| Ok::<_, BoxError>(support::pong(m))))
        .expect("serve");
    // Its transient reply queue is classic, never quorum: it starts.
    let requester = support::requester(&conn, &q);
    let reply = requester.ask(Message::new("ping")).expect("a reply");
    assert_eq!(reply.body, b"pong:ping");
    let reply_queue = requester.reply_queue().expect("a reply queue");
    let types = vhost.queue_types();
    assert_eq!(
        types.get(&reply_queue).map(String::as_str),
        Some("classic"),
        "{types:?}"
    );
    requester.close().unwrap();
    responder.close().unwrap();
    conn.close().unwrap();
}

/// The family declares a classic queue with no `x-queue-type`; this library says `classic`.
/// RabbitMQ 3.x and 4.x alike take the two as one declaration, whichever comes first.
#[test]
fn a_classic_queue_declared_by_the_family_and_by_this_library_is_one_declaration() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let raw = support::raw::Raw::open();
    let family_first = clean.queue(&unique("dq-family-first"));
    raw.declare_queue(&family_first, Default::default())
        .expect("the family's declaration");
    conn.declare_queue(&QueueSpec::new(&family_first).classic())
        .expect("ours agrees with the family's");
    let ours_first = clean.queue(&unique("dq-ours-first"));
    conn.declare_queue(&QueueSpec::new(&ours_first).classic())
        .expect("ours");
    raw.declare_queue(&ours_first, Default::default())
        .expect("the family's agrees with ours");
    let failure = acemq_amqp::failure_topology(&family_first, &[]);
    for spec in failure.queues {
        let name = clean.queue(spec.name());
        raw.declare_queue(&name, Default::default()).unwrap();
        conn.declare_queue(&spec)
            .expect("a .dlq or .parked the family declared first");
    }
    raw.close();
}

/// The default declaration stays the family's (issue 46: changing it would be a wire-contract
/// change): `QueueSpec::new` is a durable quorum queue with no dead-letter target, exactly what
/// Python's `Topology.queue(name)` declares, and `with_dead_letter` is its `dead_letter=True`
/// form. Each accepted by the broker after the other's declaration, both ways, on both majors.
#[test]
fn the_default_and_the_dead_letter_declarations_are_the_familys_on_both_majors() {
    use support::raw::text;
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let raw = support::raw::Raw::open();
    let family_quorum = || {
        let mut args = amiquip::FieldTable::new();
        args.insert("x-queue-type".into(), text("quorum"));
        args
    };
    let family_dead_letter = |q: &str| {
        let mut args = family_quorum();
        args.insert("x-dead-letter-exchange".into(), text("acemq.dlx"));
        args.insert(
            "x-dead-letter-routing-key".into(),
            text(&acemq_amqp::dead_letter_queue(q)),
        );
        args
    };
    for family_first in [true, false] {
        let plain = clean.queue(&unique("dq-default"));
        let guarded = clean.queue(&unique("dq-dead-letter"));
        if family_first {
            raw.declare_queue(&plain, family_quorum()).unwrap();
            raw.declare_queue(&guarded, family_dead_letter(&guarded))
                .unwrap();
        }
        conn.declare_queue(&QueueSpec::new(&plain))
            .expect("the default declaration is the family's");
        conn.declare_queue(&QueueSpec::new(&guarded).with_dead_letter())
            .expect("the dead-letter form is the family's");
        if !family_first {
            raw.declare_queue(&plain, family_quorum())
                .expect("the family's default agrees with ours");
            raw.declare_queue(&guarded, family_dead_letter(&guarded))
                .expect("the family's dead-letter form agrees with ours");
        }
        // And they differ from each other: the broker refuses one over the other.
        assert!(conn
            .compare_queue(&QueueSpec::new(&plain).with_dead_letter())
            .unwrap()
            .iter()
            .any(|d| d.what == "x-dead-letter-exchange"));
    }
    raw.close();
}

/// The scheduler on a default-quorum vhost: its TTL rungs and control queue stay classic, and a
/// message scheduled a second ahead arrives.
#[test]
fn on_a_default_quorum_vhost_the_schedulers_queues_stay_classic_and_a_message_arrives() {
    use acemq_amqp::patterns::scheduler::{Scheduler, SchedulerOptions};
    let vhost = QuorumVhost::new();
    let conn = vhost.connect();
    let base = unique("dq-schedule");
    let target = unique("dq-target");
    conn.declare_queue(&QueueSpec::new(&target)).unwrap();
    let scheduler = Scheduler::new(
        &conn,
        SchedulerOptions::new()
            .base(&base)
            .rungs([Duration::from_secs(1), Duration::from_secs(10)]),
    )
    .and_then(Scheduler::start)
    .expect("the scheduler starts");
    scheduler
        .after(Duration::from_secs(1), "", &target, Message::new("later"))
        .expect("scheduled");
    assert!(
        eventually(WAIT, || conn
            .queue_info(&target)
            .is_ok_and(|i| i.message_count == 1)),
        "the scheduled message arrived"
    );
    let types = vhost.queue_types();
    for q in [
        format!("{base}.1s"),
        format!("{base}.10s"),
        format!("{base}.due"),
    ] {
        assert_eq!(
            types.get(&q).map(String::as_str),
            Some("classic"),
            "{q} in {types:?}"
        );
    }
    scheduler.close().unwrap();
    conn.close().unwrap();
}
