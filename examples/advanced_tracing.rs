//! Tracing: a message arrives carrying a W3C `traceparent` (as a Java or Go service would send
//! it); everything published because of it — here a next step, and that step's own publish —
//! carries the same trace id, so a tracing backend can join the hops. With the `opentelemetry`
//! feature the library also records the family's spans; without it the headers still travel.
//! Run: `cargo run --example advanced_tracing`.

use std::sync::{Arc, Mutex};

use acemq_amqp::trace::TraceContext;
use acemq_amqp::{Message, Outcome, QueueSpec, Result};

#[path = "common/ex.rs"]
mod ex;
#[path = "common/fail.rs"]
mod fail;

fn main() {
    fail::run(example);
}

fn example() -> Result<()> {
    let connection = ex::connect()?;
    let (first, second) = (ex::name("trace.first"), ex::name("trace.second"));
    for q in [&first, &second] {
        connection.declare_queue(&QueueSpec::new(q).classic())?;
    }
    let publisher = connection.publisher()?;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (p, next, s1) = (publisher.clone(), second.clone(), seen.clone());
    let step_one = connection.consume(&first, move |m: &Message| {
        let trace = TraceContext::of(m).map(|t| t.trace_id().to_string());
        s1.lock()
            .expect("seen")
            .push(format!("{} on step one: trace {trace:?}", m.id()));
        // No trace code here: the consumed message's context is current on this thread.
        p.publish("", &next, Message::new("step two, please"))?;
        Ok(Outcome::Accept)
    })?;
    let s2 = seen.clone();
    let step_two = connection.consume(&second, move |m: &Message| {
        let trace = TraceContext::of(m).map(|t| t.trace_id().to_string());
        s2.lock()
            .expect("seen")
            .push(format!("{} on step two: trace {trace:?}", m.id()));
        Ok(Outcome::Accept)
    })?;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    println!("an incoming request with traceparent {traceparent}");
    publisher.publish(
        "",
        &first,
        Message::new("start").with_header(acemq_amqp::headers::TRACEPARENT, traceparent),
    )?;
    ex::wait_for("both steps", || seen.lock().expect("seen").len() == 2);
    step_one.close()?;
    step_two.close()?;
    for line in seen.lock().expect("seen").iter() {
        println!("  {line}");
    }
    ex::delete_queues(&connection, &[&first, &second])?;
    connection.close()
}
