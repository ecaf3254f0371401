//! A service run by the service host: consumes `invoices` until SIGTERM or SIGINT (Ctrl-C),
//! then drains — running handlers finish, what was prefetched goes back to the queue — and
//! exits with the report's code. Its settings come from the `ACEMQ_*` variables
//! (`docs/settings.md`; `ACEMQ_URL` defaults to the local broker); with the `actuator` feature
//! it serves `/readyz` and `/livez` on `ACEMQ_ACTUATOR__ADDRESS` (default 127.0.0.1:9464).
//! Run: `cargo run --example service`, stop it with Ctrl-C.
use acemq_amqp::service::{Service, ServiceOptions};
use acemq_amqp::settings::Settings;
use acemq_amqp::{Connection, Message, Outcome, QueueSpec};

fn main() -> acemq_amqp::Result<()> {
    let settings = Settings::load(None)?; // ACEMQ_URL, ACEMQ_CONSUMER__CONCURRENCY, …
    Connection::open_with(settings.connection_options()?)?
        .declare_queue(&QueueSpec::new("invoices"))?;
    let report = Service::new(ServiceOptions::from_settings("billing", &settings)?)
        .consumer("invoices", settings.consumer_options(), |m: &Message| {
            println!("invoice {}", m.id());
            Ok(Outcome::Accept)
        })
        .run()?; // blocks until SIGTERM or SIGINT, then drains
    println!("{report}");
    std::process::exit(report.exit_code());
}
