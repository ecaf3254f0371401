//! Order fulfilment: five services — gateway, fulfilment, inventory, payments, shipping and
//! notifications — as threads of one binary that talk **only through the broker**, each with the
//! pattern a real service would use:
//!
//! * the **gateway** writes each order and its `order.placed` event in one SQLite transaction
//!   (the transactional outbox); a running relay publishes the events;
//! * **fulfilment** consumes `order.placed` through an idempotent consumer (receipts in SQLite)
//!   and runs a **saga** per order: reserve stock and charge the card by **request/reply**, then
//!   send a ship command; a declined card compensates (the stock is released) and publishes
//!   `order.compensated`;
//! * **inventory** and **payments** are responders;
//! * **shipping** retries failures and dead-letters an order it can never ship (a bad address);
//!   once the address book is fixed, the dead letter is **replayed** and shipped;
//! * **notifications** counts `order.shipped` and `order.compensated`.
//!
//! Each service is run by the service host (`acemq_amqp::service`), as a deployed one would be
//! (there it would stop on SIGTERM; here the app stops each one when the story is told, and
//! prints its drain report). It ends with a summary that adds up: orders placed = shipped +
//! compensated.
//! Run: `cargo run --example app_order_fulfilment` (under a minute).

use acemq_amqp::{ExchangeKind, ExchangeSpec, Result};

#[path = "../../common/ex.rs"]
mod ex;
#[path = "../../common/fail.rs"]
mod fail;
mod services;

/// How many orders the gateway places.
const ORDERS: usize = 20;

fn main() {
    fail::run(app);
}

fn app() -> Result<()> {
    let names = services::Names::new();
    let dir = tempfile::tempdir().map_err(|e| acemq_amqp::Error::Io {
        context: "making a temporary directory".into(),
        source: e,
    })?;
    let admin = ex::connect()?;
    admin.declare_exchange(&ExchangeSpec::new(&names.events, ExchangeKind::Topic))?;

    // Each service runs on the service host with connections of its own, as separate
    // processes would; the operator's connection declares their queues.
    let notifications = services::notifications(&admin, &names)?;
    let inventory = services::inventory(&admin, &names)?;
    let payments = services::payments(&admin, &names)?;
    let shipping = services::shipping(&admin, &names)?;
    let fulfilment = services::fulfilment(&admin, &names, dir.path())?;
    let gateway = services::gateway(&names, dir.path(), ORDERS)?;
    println!("gateway: {ORDERS} orders placed (each with its event, in one transaction)");

    // One order's address is wrong: shipping dead-letters it. The address book is fixed and the
    // dead letter replayed.
    ex::wait_for(
        "one undeliverable order on the shipping dead-letter queue",
        || shipping.dead_letters(&admin) == 1,
    );
    println!(
        "shipping: one order could not be shipped (bad address) and is on its dead-letter queue"
    );
    shipping.fix_address_book();
    let report = acemq_amqp::patterns::replay::replay(
        &admin,
        &acemq_amqp::dead_letter_queue(&names.shipping),
        acemq_amqp::patterns::replay::ReplayOptions::default(),
    )
    .run()?;
    println!("operator: address book fixed; replayed the dead letter: {report}");

    ex::wait_for("every order shipped or compensated", || {
        notifications.shipped() + notifications.compensated() == ORDERS
    });
    // The relay sends the first order's event once more, as one killed between its publish and
    // its delete would after a restart: fulfilment's receipts absorb it.
    gateway.send_first_event_again()?;
    ex::wait_for("the repeated event absorbed", || {
        fulfilment.duplicates() == 1
    });
    println!("gateway: the first order's event went out a second time (a relay restarted after a crash); fulfilment absorbed it");
    let (shipped, compensated) = (notifications.shipped(), notifications.compensated());
    println!();
    println!("summary");
    println!("  orders placed:        {ORDERS}");
    println!("  shipped:              {shipped}");
    println!(
        "  compensated:          {compensated} (card declined; stock released: {})",
        inventory.released()
    );
    println!("  duplicates absorbed:  {}", fulfilment.duplicates());
    println!("  stock left:           {}", inventory.stock());
    println!(
        "  placed = shipped + compensated: {}",
        if ORDERS == shipped + compensated {
            "yes"
        } else {
            "NO"
        }
    );

    println!();
    println!("each service drains: its consumers stop taking deliveries and finish what runs");
    gateway.close()?;
    fulfilment.close()?;
    shipping.close()?;
    payments.close()?;
    inventory.close()?;
    notifications.close()?;
    names.delete(&admin)?;
    admin.close()
}
