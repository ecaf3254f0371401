//! The scheduler: a reminder delivered 2 s later and an invoice at a given moment, moved down
//! the family's TTL ladder and delivered under a fresh envelope of type `ScheduledMessage`.
//! A service uses the family's shared ladder (`acemq.schedule.*`, the default, which other
//! AceMQ libraries' schedulers may be using at the same time, so it is left in place); this
//! example runs the same ladder under a base of its own, `example.schedule.{pid}`, and deletes
//! what it declared when it ends.
//! Run: `cargo run --example intermediate_scheduler`.

use std::time::{Duration, Instant};

use acemq_amqp::patterns::scheduler::{hop_plan, Scheduler, SchedulerOptions};
use acemq_amqp::{Connection, Message, QueueSpec, Result};
use time::format_description::BorrowedFormatItem;
use time::macros::format_description;

#[path = "common/ex.rs"]
mod ex;
#[path = "common/fail.rs"]
mod fail;

/// RFC 3339 in UTC, to the millisecond: `2026-12-01T22:04:11.987Z`.
const RFC3339_MS: &[BorrowedFormatItem<'static>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z");

fn main() {
    fail::run(example);
}

fn example() -> Result<()> {
    let connection = ex::connect()?;
    let inbox = ex::name("reminders");
    connection.declare_queue(&QueueSpec::new(&inbox).classic())?;
    let options = SchedulerOptions::new().base(ex::name("schedule"));
    let topology = options.topology();
    let shown = schedule(&connection, &inbox, options);
    // What this run declared, whether or not it went well: the ladder's queues, its exchange,
    // the inbox.
    for q in &topology.queues {
        connection.delete_queue(q.name())?;
    }
    connection.delete_exchange(topology.exchange.name())?;
    ex::delete_queues(&connection, &[&inbox])?;
    shown?;
    println!(
        "deleted its ladder {}.* (a service's shared acemq.schedule.* stays in place)",
        topology.exchange.name()
    );
    connection.close()
}

fn schedule(connection: &Connection, inbox: &str, options: SchedulerOptions) -> Result<()> {
    let scheduler = Scheduler::new(connection, options).and_then(Scheduler::start)?;
    println!(
        "a 90 s delay would hop: {:?}",
        hop_plan(Duration::from_secs(90))
    );

    let asked = Instant::now();
    scheduler.after(
        Duration::from_secs(2),
        "",
        inbox,
        Message::new("call the customer back"),
    )?;
    let at = time::OffsetDateTime::now_utc() + time::Duration::seconds(3);
    scheduler.at(at, "", inbox, Message::new("send invoice inv-9"))?;
    println!(
        "scheduled a reminder in 2 s and an invoice at {}",
        at.format(RFC3339_MS).expect("a UTC time formats")
    );
    for _ in 0..2 {
        let mut got = None;
        ex::wait_for("a scheduled message", || {
            got = connection.get(inbox).ok().flatten();
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
    Ok(())
}
