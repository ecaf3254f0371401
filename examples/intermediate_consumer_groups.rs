//! Consumer groups: four consumers of one queue, each with its own channel and prefetch,
//! sharing one handler; the broker spreads 200 messages over them, each handled once; closing
//! the group closes all four and sums their reports.
//! Run: `cargo run --example intermediate_consumer_groups`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use acemq_amqp::patterns::consumer_group::{ConsumerGroup, ConsumerGroupOptions};
use acemq_amqp::{ConsumerOptions, Message, Outcome, QueueSpec, Result};

#[path = "common/ex.rs"]
mod ex;
#[path = "common/fail.rs"]
mod fail;

fn main() {
    fail::run(example);
}

fn example() -> Result<()> {
    let connection = ex::connect()?;
    let queue = ex::name("thumbnails");
    connection.declare_queue(&QueueSpec::new(&queue))?;
    let by_member = Arc::new(Mutex::new(BTreeMap::<String, usize>::new()));
    let b = by_member.clone();
    let group = ConsumerGroup::new(
        &connection,
        &queue,
        ConsumerGroupOptions::new()
            .members(4)
            .consumer(ConsumerOptions::new().prefetch(10)),
    )
    .and_then(|group| {
        group.start(move |_: &Message| {
            let thread = std::thread::current().name().unwrap_or("?").to_string();
            *b.lock().expect("counts").entry(thread).or_default() += 1;
            std::thread::sleep(std::time::Duration::from_millis(2)); // a little work
            Ok(Outcome::Accept)
        })
    })?;
    let publisher = connection.publisher()?;
    for i in 0..200 {
        publisher
            .publish_deferred("", &queue, Message::new(format!("image {i}")))?
            .wait()?;
    }
    ex::wait_for("200 messages handled", || {
        by_member.lock().expect("counts").values().sum::<usize>() == 200
    });
    let report = group.close()?;
    for (thread, n) in by_member.lock().expect("counts").iter() {
        println!("  {thread}: {n} messages");
    }
    println!(
        "group closed: {} finished in flight, {} requeued",
        report.finished_in_time, report.requeued
    );
    ex::delete_queues(&connection, &[&queue])?;
    connection.close()
}
