//! A service run by the service host: consumes `invoices` until SIGTERM or SIGINT (Ctrl-C),
//! then drains — running handlers finish, what was prefetched goes back to the queue — and
//! exits with the report's code. `ACEMQ_URL` names the broker (default the local one).
//! Run: `cargo run --example service`, stop it with Ctrl-C.
use acemq_amqp::service::{Service, ServiceOptions};
use acemq_amqp::{Connection, ConnectionOptions, ConsumerOptions, Message, Outcome, QueueSpec};

fn main() -> acemq_amqp::Result<()> {
    let url = std::env::var("ACEMQ_URL").unwrap_or("amqp://guest:guest@127.0.0.1:5672/".into());
    Connection::open(&url)?.declare_queue(&QueueSpec::new("invoices"))?;
    let options = ServiceOptions::new("billing", ConnectionOptions::new().address(url));
    let report = Service::new(options)
        .consumer(
            "invoices",
            ConsumerOptions::new().concurrency(4),
            |m: &Message| {
                println!("invoice {}", m.id());
                Ok(Outcome::Accept)
            },
        )
        .run()?; // blocks until SIGTERM or SIGINT, then drains
    println!("{report}");
    std::process::exit(report.exit_code());
}
