//! Request/reply: a responder answers price requests on threads of its own; eight threads ask
//! through one shared `Requester` at once and each gets exactly its own answer; a request for
//! an unknown SKU comes back as the responder's error in milliseconds, not a timeout.
//! Run: `cargo run --example intermediate_request_reply`.

use acemq_amqp::patterns::request_reply::{
    Requester, RequesterOptions, Responder, ResponderOptions,
};
use acemq_amqp::{BoxError, ConsumerOptions, Message, QueueSpec, Result};

#[path = "common/ex.rs"]
mod ex;
#[path = "common/fail.rs"]
mod fail;

fn main() {
    fail::run(example);
}

fn example() -> Result<()> {
    let connection = ex::connect()?;
    let prices = ex::name("prices");
    connection.declare_queue(&QueueSpec::new(&prices).classic())?;
    let responder = Responder::new(
        &connection,
        &prices,
        ResponderOptions::new().consumer(ConsumerOptions::new().concurrency(4)),
    )?
    .start(
        |request: &Message| -> std::result::Result<String, BoxError> {
            let sku = String::from_utf8_lossy(&request.body).to_string();
            match sku.strip_prefix("sku-").and_then(|n| n.parse::<u32>().ok()) {
                Some(n) => Ok(format!("{sku}: {}.{:02}", 10 + n, n % 100)),
                None => Err(format!("no such product: {sku}").into()),
            }
        },
    )?;
    let requester =
        Requester::new(&connection, RequesterOptions::new().routing_key(&prices))?.start()?;
    std::thread::scope(|s| {
        for t in 1..=8 {
            let requester = &requester;
            s.spawn(move || {
                let reply = requester.ask(format!("sku-{t}")).expect("a price");
                println!(
                    "  caller {t} asked for sku-{t}, got {:?}",
                    String::from_utf8_lossy(&reply.body)
                );
            });
        }
    });
    let started = std::time::Instant::now();
    match requester.ask("gift-card") {
        Err(e) => println!("an unknown product fails in {:?}: {e}", started.elapsed()),
        Ok(r) => println!("unexpected: {r:?}"),
    }
    println!("the responder answered {} requests", responder.answered());
    requester.close()?;
    responder.close()?;
    ex::delete_queues(&connection, &[&prices])?;
    connection.close()
}
