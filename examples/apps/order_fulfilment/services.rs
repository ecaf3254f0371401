//! The services of the order fulfilment app. Each takes its own `Connection` and touches the
//! others only through the broker.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_amqp::patterns::idempotency::{SqlIdempotencyStore, SqlIdempotencyStoreOptions};
use acemq_amqp::patterns::idempotent::{idempotent, DuplicateCount, IdempotentOptions};
use acemq_amqp::patterns::outbox::{
    record, NewOutboxRecord, OutboxRelay, OutboxRelayOptions, RunningRelay, SqlOutboxStore,
    SqlOutboxStoreOptions,
};
use acemq_amqp::patterns::request_reply::{
    Requester, RequesterOptions, Responder, ResponderOptions, RunningRequester, RunningResponder,
};
use acemq_amqp::patterns::saga::Saga;
use acemq_amqp::{
    dead_letter_queue, Binding, BoxError, Connection, ConsumerOptions, FatalError, JsonCodec,
    Message, Outcome, QueueSpec, Result, RetryPolicy, RunningConsumer,
};
use serde_json::{json, Value};

use super::ex;

/// Every name the app declares, unique to this run.
pub struct Names {
    pub events: String,
    pub fulfilment: String,
    pub inventory: String,
    pub payments: String,
    pub shipping: String,
    pub notifications: String,
}

impl Names {
    pub fn new() -> Names {
        Names {
            events: ex::name("shop.events"),
            fulfilment: ex::name("shop.fulfilment"),
            inventory: ex::name("shop.inventory"),
            payments: ex::name("shop.payments"),
            shipping: ex::name("shop.shipping"),
            notifications: ex::name("shop.notifications"),
        }
    }

    pub fn delete(&self, connection: &Connection) -> Result<()> {
        ex::delete_queues(
            connection,
            &[
                &self.fulfilment,
                &self.inventory,
                &self.payments,
                &self.shipping,
                &self.notifications,
            ],
        )?;
        connection.delete_exchange(&self.events)
    }
}

fn sqlite(
    path: std::path::PathBuf,
) -> impl Fn() -> Result<rusqlite::Connection> + Clone + Send + Sync + 'static {
    move || Ok(rusqlite::Connection::open(&path)?)
}

/// The gateway: each order row and its `order.placed` event in one transaction; a running
/// relay publishes the events.
pub struct Gateway {
    relay: RunningRelay,
    outbox: SqlOutboxStore,
    open: Box<dyn Fn() -> Result<rusqlite::Connection> + Send + Sync>,
    first_event: NewOutboxRecord,
}

impl Gateway {
    /// Puts the first order's event in the outbox again, with its id: what a relay killed
    /// between its publish and its delete sends once more after a restart.
    pub fn send_first_event_again(&self) -> Result<()> {
        let mut db = (self.open)()?;
        let mut tx = db.transaction()?;
        self.outbox.add(&mut tx, &self.first_event)?;
        tx.commit()?;
        Ok(())
    }

    pub fn close(self) -> Result<()> {
        self.relay.close().map(|_| ())
    }
}

pub fn gateway(
    connection: &Connection,
    names: &Names,
    dir: &Path,
    orders: usize,
) -> Result<Gateway> {
    let open = sqlite(dir.join("gateway.db"));
    let mut db = open()?;
    db.execute(
        "CREATE TABLE orders (id TEXT PRIMARY KEY, total_cents INTEGER, address TEXT)",
        [],
    )?;
    let outbox = SqlOutboxStore::open(open.clone(), SqlOutboxStoreOptions::default())?;
    outbox.create_table()?;
    let mut first_event = None;
    for i in 1..=orders {
        let id = format!("o-{i}");
        // Every fifth order is too expensive for its card; order 7's address is wrong.
        let total = if i % 5 == 0 {
            250_000
        } else {
            1_000 + 100 * i as i64
        };
        let address = if i == 7 { "nowhere" } else { "1 High Street" };
        let event = record(
            &JsonCodec,
            &names.events,
            "order.placed",
            &json!({"order_id": id, "total_cents": total, "address": address}),
        )?;
        let tx = db.transaction()?;
        tx.execute(
            "INSERT INTO orders VALUES (?1, ?2, ?3)",
            rusqlite::params![id, total, address],
        )?;
        let mut tx = tx;
        outbox.add(&mut tx, &event)?;
        tx.commit()?;
        first_event.get_or_insert(event);
    }
    let relay = OutboxRelay::new(
        connection,
        SqlOutboxStore::open(open.clone(), SqlOutboxStoreOptions::default())?,
        OutboxRelayOptions::new().interval(Duration::from_millis(100)),
    )?
    .start()?;
    Ok(Gateway {
        relay,
        outbox,
        open: Box::new(open),
        first_event: first_event.ok_or_else(|| acemq_amqp::Error::InvalidArgument {
            reason: "the gateway places at least one order".into(),
        })?,
    })
}

/// Fulfilment: an idempotent consumer of `order.placed` running a saga per order.
pub struct Fulfilment {
    consumer: RunningConsumer,
    duplicates: DuplicateCount,
    inventory: Arc<RunningRequester>,
    payments: Arc<RunningRequester>,
}

impl Fulfilment {
    pub fn duplicates(&self) -> u64 {
        self.duplicates.get()
    }

    pub fn close(self) -> Result<()> {
        self.consumer.close()?;
        if let Ok(r) = Arc::try_unwrap(self.inventory) {
            r.close()?;
        }
        if let Ok(r) = Arc::try_unwrap(self.payments) {
            r.close()?;
        }
        Ok(())
    }
}

pub fn fulfilment(connection: &Connection, names: &Names, dir: &Path) -> Result<Fulfilment> {
    connection.declare_queue(&QueueSpec::new(&names.fulfilment))?;
    connection.bind(
        &Binding::new()
            .queue(&names.fulfilment)
            .exchange(&names.events)
            .routing_key("order.placed"),
    )?;
    let inventory = Arc::new(
        Requester::new(
            connection,
            RequesterOptions::new().routing_key(&names.inventory),
        )?
        .start()?,
    );
    let payments = Arc::new(
        Requester::new(
            connection,
            RequesterOptions::new().routing_key(&names.payments),
        )?
        .start()?,
    );
    let publisher = connection.publisher()?;
    let receipts = SqlIdempotencyStore::open(
        sqlite(dir.join("fulfilment.db")),
        SqlIdempotencyStoreOptions::default(),
    )?;
    receipts.create_table()?;

    type Step = std::result::Result<(), BoxError>;
    let (inv, inv2, pay, ship) = (
        inventory.clone(),
        inventory.clone(),
        payments.clone(),
        publisher.clone(),
    );
    let shipping_queue = names.shipping.clone();
    let saga: Saga<Value> = Saga::new("fulfil-order")
        .step(
            "reserve-stock",
            move |order: &Value| -> Step {
                inv.ask(Message::encode(
                    &JsonCodec,
                    &json!({"reserve": order["order_id"]}),
                )?)?;
                Ok(())
            },
            move |order: &Value| -> Step {
                inv2.ask(Message::encode(
                    &JsonCodec,
                    &json!({"release": order["order_id"]}),
                )?)?;
                Ok(())
            },
        )
        .step_without_compensation("charge-card", move |order: &Value| -> Step {
            pay.ask(Message::encode(&JsonCodec, order)?)?;
            Ok(())
        })
        .step_without_compensation("ship", move |order: &Value| -> Step {
            ship.publish("", &shipping_queue, Message::encode(&JsonCodec, order)?)?;
            Ok(())
        });
    let (events, compensated) = (names.events.clone(), publisher);
    let handler = idempotent(
        receipts,
        move |m: &Message| {
            let order: Value = m.payload()?;
            let report = saga.run(&order);
            if !report.succeeded() {
                println!("fulfilment: {report}");
                compensated.publish(
                    &events,
                    "order.compensated",
                    Message::encode(&JsonCodec, &order)?,
                )?;
            }
            Ok(Outcome::Accept)
        },
        IdempotentOptions::default(),
    );
    let duplicates = handler.duplicates();
    let consumer = connection
        .consumer(&names.fulfilment, ConsumerOptions::new().concurrency(4))?
        .start(handler)?;
    Ok(Fulfilment {
        consumer,
        duplicates,
        inventory,
        payments,
    })
}

/// Inventory: answers `reserve` and `release` requests.
pub struct Inventory {
    responder: RunningResponder,
    stock: Arc<Mutex<i64>>,
    released: Arc<AtomicUsize>,
}

impl Inventory {
    pub fn stock(&self) -> i64 {
        *self.stock.lock().expect("stock")
    }
    pub fn released(&self) -> usize {
        self.released.load(Ordering::SeqCst)
    }
    pub fn close(self) -> Result<()> {
        self.responder.close().map(|_| ())
    }
}

pub fn inventory(connection: &Connection, names: &Names) -> Result<Inventory> {
    connection.declare_queue(&QueueSpec::new(&names.inventory).classic())?;
    let stock = Arc::new(Mutex::new(100i64));
    let released = Arc::new(AtomicUsize::new(0));
    let (s, r) = (stock.clone(), released.clone());
    let responder = Responder::new(connection, &names.inventory, ResponderOptions::new())?.start(
        move |m: &Message| -> std::result::Result<&'static str, BoxError> {
            let request: Value = m.payload()?;
            let mut stock = s.lock().expect("stock");
            if request.get("release").is_some() {
                *stock += 1;
                r.fetch_add(1, Ordering::SeqCst);
            } else {
                *stock -= 1;
            }
            Ok("ok")
        },
    )?;
    Ok(Inventory {
        responder,
        stock,
        released,
    })
}

/// Payments: declines a charge over 2,000.00.
pub struct Payments {
    responder: RunningResponder,
}

impl Payments {
    pub fn close(self) -> Result<()> {
        self.responder.close().map(|_| ())
    }
}

pub fn payments(connection: &Connection, names: &Names) -> Result<Payments> {
    connection.declare_queue(&QueueSpec::new(&names.payments).classic())?;
    let responder = Responder::new(connection, &names.payments, ResponderOptions::new())?.start(
        |m: &Message| -> std::result::Result<&'static str, BoxError> {
            let order: Value = m.payload()?;
            if order["total_cents"].as_i64().unwrap_or(0) > 200_000 {
                return Err(format!("card declined for {}", order["order_id"]).into());
            }
            Ok("charged")
        },
    )?;
    Ok(Payments { responder })
}

/// Shipping: retries, and dead-letters an order with an address it does not know.
pub struct Shipping {
    consumer: RunningConsumer,
    fixed: Arc<AtomicBool>,
    queue: String,
}

impl Shipping {
    pub fn dead_letters(&self, connection: &Connection) -> u32 {
        connection
            .queue_info(&dead_letter_queue(&self.queue))
            .map(|q| q.message_count)
            .unwrap_or(0)
    }
    pub fn fix_address_book(&self) {
        self.fixed.store(true, Ordering::SeqCst);
    }
    pub fn close(self) -> Result<()> {
        self.consumer.close().map(|_| ())
    }
}

pub fn shipping(connection: &Connection, names: &Names) -> Result<Shipping> {
    connection.declare_queue(&QueueSpec::new(&names.shipping))?;
    let publisher = connection.publisher()?;
    let fixed = Arc::new(AtomicBool::new(false));
    let (f, events) = (fixed.clone(), names.events.clone());
    let policy = RetryPolicy::exponential()
        .max_attempts(3)
        .initial_delay(Duration::from_millis(50))
        .max_delay(Duration::from_millis(200));
    let consumer = connection
        .consumer(&names.shipping, ConsumerOptions::new().retry(policy))?
        .start(move |m: &Message| {
            let order: Value = m.payload()?;
            if order["address"] == "nowhere" && !f.load(Ordering::SeqCst) {
                return Err(
                    FatalError::new(format!("no such address for {}", order["order_id"])).into(),
                );
            }
            publisher.publish(
                &events,
                "order.shipped",
                Message::encode(&JsonCodec, &order)?,
            )?;
            Ok(Outcome::Accept)
        })?;
    Ok(Shipping {
        consumer,
        fixed,
        queue: names.shipping.clone(),
    })
}

/// Notifications: counts what customers are told.
pub struct Notifications {
    consumer: RunningConsumer,
    shipped: Arc<AtomicUsize>,
    compensated: Arc<AtomicUsize>,
}

impl Notifications {
    pub fn shipped(&self) -> usize {
        self.shipped.load(Ordering::SeqCst)
    }
    pub fn compensated(&self) -> usize {
        self.compensated.load(Ordering::SeqCst)
    }
    pub fn close(self) -> Result<()> {
        self.consumer.close().map(|_| ())
    }
}

pub fn notifications(connection: &Connection, names: &Names) -> Result<Notifications> {
    connection.declare_queue(&QueueSpec::new(&names.notifications))?;
    connection.bind(
        &Binding::new()
            .queue(&names.notifications)
            .exchange(&names.events)
            .routing_key("order.shipped"),
    )?;
    connection.bind(
        &Binding::new()
            .queue(&names.notifications)
            .exchange(&names.events)
            .routing_key("order.compensated"),
    )?;
    let (shipped, compensated) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (s, c) = (shipped.clone(), compensated.clone());
    let consumer = connection.consume(&names.notifications, move |m: &Message| {
        let order: Value = m.payload()?;
        match m.received.as_ref().map(|r| r.routing_key.as_str()) {
            Some("order.shipped") => {
                s.fetch_add(1, Ordering::SeqCst);
                println!("notifications: {} is on its way", order["order_id"]);
            }
            _ => {
                c.fetch_add(1, Ordering::SeqCst);
                println!(
                    "notifications: {} was cancelled, nothing charged",
                    order["order_id"]
                );
            }
        }
        Ok(Outcome::Accept)
    })?;
    Ok(Notifications {
        consumer,
        shipped,
        compensated,
    })
}
