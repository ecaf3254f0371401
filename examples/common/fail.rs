//! How an example ends when something is wrong: one line that says what happened and what to do,
//! not a `Debug` dump.

use acemq_amqp::Error;

/// Runs `body`; on an error prints one readable line to stderr and exits with status 1.
pub fn run<E: std::fmt::Display + 'static>(body: impl FnOnce() -> Result<(), E>) {
    if let Err(e) = body() {
        eprintln!("{}", explain(&e));
        std::process::exit(1);
    }
}

fn explain<E: std::fmt::Display + 'static>(e: &E) -> String {
    let any: &dyn std::any::Any = e;
    let ours = any.downcast_ref::<Error>().or_else(|| {
        any.downcast_ref::<Box<dyn std::error::Error>>()
            .and_then(|b| b.downcast_ref::<Error>())
    });
    match ours {
        Some(Error::Connect { .. }) => format!(
            "RabbitMQ is not reachable ({e}) — start it (`rabbitmq-server -detached`), or run \
             scripts/tour, which starts or installs it"
        ),
        Some(Error::Sql { .. }) => format!(
            "the database refused ({e}) — is PostgreSQL up at 127.0.0.1:5432? scripts/test \
             starts or installs it"
        ),
        _ => format!("error: {e}"),
    }
}
