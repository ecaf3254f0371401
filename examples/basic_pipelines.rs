//! Pipelines: a routing slip carries its itinerary (pack → label → ship) in the message; each
//! stop runs its step and sends the result to the next stop, confirmed, before it accepts. The
//! last stop only accepts.
//! Run: `cargo run --example basic_pipelines`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use acemq_amqp::patterns::routing_slip::{follow_slip, FollowSlipOptions, RoutingSlip};
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
    let publisher = connection.publisher()?;
    let (pack, label, ship) = (ex::name("pack"), ex::name("label"), ex::name("ship"));
    for q in [&pack, &label, &ship] {
        connection.declare_queue(&QueueSpec::new(q).classic())?;
    }
    let append = |what: &'static str| {
        move |m: &Message| {
            let mut body = m.body.clone();
            body.extend_from_slice(what.as_bytes());
            println!("  {what:>9}: {}", String::from_utf8_lossy(&body));
            Ok(Some(Message::new(body)))
        }
    };
    let shipped = Arc::new(AtomicBool::new(false));
    let s = shipped.clone();
    let stops = vec![
        connection.consume(
            &pack,
            follow_slip(&publisher, append(" [packed]"), FollowSlipOptions::new()),
        )?,
        connection.consume(
            &label,
            follow_slip(&publisher, append(" [labelled]"), FollowSlipOptions::new()),
        )?,
        connection.consume(
            &ship,
            follow_slip(
                &publisher,
                move |m: &Message| {
                    println!("  shipping: {}", String::from_utf8_lossy(&m.body));
                    s.store(true, Ordering::SeqCst);
                    Ok(None)
                },
                FollowSlipOptions::new(),
            ),
        )?,
    ];
    let slip = RoutingSlip::new()
        .then("", &pack, "pack")
        .then("", &label, "label")
        .then("", &ship, "ship");
    println!("sending order o-4 with a three-stop routing slip (JSON in acemq-routing-slip)");
    slip.send(&publisher, Message::new("order o-4"))?;
    ex::wait_for("the order to be shipped", || shipped.load(Ordering::SeqCst));
    for stop in stops {
        stop.close()?;
    }
    ex::delete_queues(&connection, &[&pack, &label, &ship])?;
    connection.close()
}
