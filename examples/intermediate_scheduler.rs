//! The scheduler: a reminder delivered 2 s later and an invoice at a given moment, moved down
//! the family's TTL ladder (`acemq.schedule.*`, shared with the other AceMQ libraries) and
//! delivered under a fresh envelope of type `ScheduledMessage`.
//! Run: `cargo run --example intermediate_scheduler`. (It leaves the shared
//! `acemq.schedule.*` topology in place: other services may be using it.)

use std::time::{Duration, Instant};

use acemq_amqp::patterns::scheduler::{hop_plan, Scheduler, SchedulerOptions};
use acemq_amqp::{Message, QueueSpec, Result};

#[path = "common/ex.rs"]
mod ex;
#[path = "common/fail.rs"]
mod fail;

fn main() {
    fail::run(example);
}

fn example() -> Result<()> {
    let connection = ex::connect()?;
    let inbox = ex::name("reminders");
    connection.declare_queue(&QueueSpec::new(&inbox).classic())?;
    let scheduler =
        Scheduler::new(&connection, SchedulerOptions::default()).and_then(Scheduler::start)?;
    println!(
        "a 90 s delay would hop: {:?}",
        hop_plan(Duration::from_secs(90))
    );

    let asked = Instant::now();
    scheduler.after(
        Duration::from_secs(2),
        "",
        &inbox,
        Message::new("call the customer back"),
    )?;
    let at = time::OffsetDateTime::now_utc() + time::Duration::seconds(3);
    scheduler.at(at, "", &inbox, Message::new("send invoice inv-9"))?;
    println!("scheduled a reminder in 2 s and an invoice at {at}");
    for _ in 0..2 {
        let mut got = None;
        ex::wait_for("a scheduled message", || {
            got = connection.get(&inbox).ok().flatten();
            got.is_some()
        });
        let m = got.expect("delivered");
        println!(
            "  after {:.1} s: {:?} (type {:?})",
            asked.elapsed().as_secs_f64(),
            String::from_utf8_lossy(&m.body),
            m.envelope.message_type.as_deref().unwrap_or("-")
        );
    }
    println!(
        "scheduled {}, delivered {}, hops {}",
        scheduler.scheduled(),
        scheduler.delivered(),
        scheduler.hops()
    );
    scheduler.close()?;
    ex::delete_queues(&connection, &[&inbox])?;
    connection.close()
}
