//! The services of the order fulfilment app. Each is run by the service host
//! (`acemq_amqp::service`) on connections of its own, as a separate process would be, and
//! touches the others only through the broker; each declares its queues first, on the
//! operator's connection.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_amqp::patterns::idempotency::{SqlIdempotencyStore, SqlIdempotencyStoreOptions};
use acemq_amqp::patterns::idempotent::{idempotent, DuplicateCount, IdempotentOptions};
use acemq_amqp::patterns::outbox::{
    record, NewOutboxRecord, OutboxRelayOptions, SqlOutboxStore, SqlOutboxStoreOptions,
};
use acemq_amqp::patterns::request_reply::{
    Requester, RequesterOptions, ResponderOptions, RunningRequester,
};
use acemq_amqp::patterns::saga::Saga;
use acemq_amqp::service::{
    Connections, PartReport, RunningService, Service, ServiceOptions, ServicePart, Stage,
};
use acemq_amqp::{
    dead_letter_queue, Binding, BoxError, Connection, ConnectionOptions, ConsumerOptions,
    FatalError, JsonCodec, Message, Outcome, QueueSpec, Result, RetryPolicy, RunningConsumer,
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

/// A service named `name` on the example's broker. The app stops each one itself, so the
/// services do not listen for signals (a real service keeps the default: SIGTERM drains it).
fn service(name: &str) -> Service {
    Service::new(
        ServiceOptions::new(name, ConnectionOptions::new().address(ex::url()))
            .drain_timeout(Duration::from_secs(10))
            .signals(false),
    )
}

/// Stops a service, draining it, and says what it did.
fn stop(service: RunningService) -> Result<()> {
    let report = service.stop();
    println!("{report}");
    match report.exit_code() {
        0 => Ok(()),
        _ => Err(acemq_amqp::Error::InvalidArgument {
            reason: format!("a service did not stop cleanly: {report}"),
        }),
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
    service: RunningService,
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
        stop(self.service)
    }
}

pub fn gateway(names: &Names, dir: &Path, orders: usize) -> Result<Gateway> {
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
    let service = service("gateway")
        .relay(
            SqlOutboxStore::open(open.clone(), SqlOutboxStoreOptions::default())?,
            OutboxRelayOptions::new().interval(Duration::from_millis(100)),
        )
        .start()?;
    Ok(Gateway {
        service,
        outbox,
        open: Box::new(open),
        first_event: first_event.ok_or_else(|| acemq_amqp::Error::InvalidArgument {
            reason: "the gateway places at least one order".into(),
        })?,
    })
}

/// Fulfilment: an idempotent consumer of `order.placed` running a saga per order, with two
/// requesters — a part of the service's own ([`FulfilmentPart`]).
pub struct Fulfilment {
    service: RunningService,
    /// The idempotent handler's count, put here by the part when it starts.
    duplicates: Arc<Mutex<DuplicateCount>>,
}

impl Fulfilment {
    pub fn duplicates(&self) -> u64 {
        self.duplicates.lock().expect("duplicates").get()
    }

    pub fn close(self) -> Result<()> {
        stop(self.service)
    }
}

/// The fulfilment consumer and the requesters its saga asks through: stopped with the
/// consumers, the requesters after the consumer has drained (a running saga still asks).
struct FulfilmentPart {
    consumer: RunningConsumer,
    requesters: Vec<Arc<RunningRequester>>,
}

impl ServicePart for FulfilmentPart {
    fn stage(&self) -> Stage {
        Stage::Consumers
    }

    fn is_finished(&self) -> bool {
        self.consumer.is_finished()
    }

    fn stop(self: Box<Self>, deadline: Duration) -> PartReport {
        let mut report = ServicePart::stop(Box::new(self.consumer), deadline);
        for requester in self.requesters {
            if let Ok(r) = Arc::try_unwrap(requester) {
                if let Err(e) = r.close() {
                    report.error.get_or_insert(e.to_string());
                }
            }
        }
        report
    }
}

pub fn fulfilment(admin: &Connection, names: &Names, dir: &Path) -> Result<Fulfilment> {
    admin.declare_queue(&QueueSpec::new(&names.fulfilment))?;
    admin.bind(
        &Binding::new()
            .queue(&names.fulfilment)
            .exchange(&names.events)
            .routing_key("order.placed"),
    )?;
    let receipts = SqlIdempotencyStore::open(
        sqlite(dir.join("fulfilment.db")),
        SqlIdempotencyStoreOptions::default(),
    )?;
    receipts.create_table()?;
    let duplicates = Arc::new(Mutex::new(DuplicateCount::default()));
    let counted = duplicates.clone();
    let names = (
        names.fulfilment.clone(),
        names.inventory.clone(),
        names.payments.clone(),
        names.shipping.clone(),
        names.events.clone(),
    );
    let service = service("fulfilment")
        .part("fulfilment", move |c: &Connections| {
            let (queue, inventory, payments, shipping, events) = names;
            let ask = |queue: &str| -> Result<Arc<RunningRequester>> {
                let options = RequesterOptions::new().routing_key(queue);
                Ok(Arc::new(Requester::new(c.consuming(), options)?.start()?))
            };
            let (inventory, payments) = (ask(&inventory)?, ask(&payments)?);
            let publisher = c.publishing().publisher()?;
            let handler = idempotent(
                receipts,
                order_handler(&inventory, &payments, publisher, shipping, events),
                IdempotentOptions::default(),
            );
            *counted.lock().expect("duplicates") = handler.duplicates();
            let consumer = c
                .consuming()
                .consumer(&queue, ConsumerOptions::new().concurrency(4))?
                .start(handler)?;
            Ok(Box::new(FulfilmentPart {
                consumer,
                requesters: vec![inventory, payments],
            }) as Box<dyn ServicePart>)
        })
        .start()?;
    Ok(Fulfilment {
        service,
        duplicates,
    })
}

/// Runs the saga for one order: reserve stock, charge the card, send the ship command; a
/// failed step compensates and the order is announced `order.compensated`.
fn order_handler(
    inventory: &Arc<RunningRequester>,
    payments: &Arc<RunningRequester>,
    publisher: acemq_amqp::Publisher,
    shipping_queue: String,
    events: String,
) -> impl Fn(&Message) -> acemq_amqp::HandlerResult + Send + Sync + 'static {
    type Step = std::result::Result<(), BoxError>;
    let (inv, inv2, pay, ship) = (
        inventory.clone(),
        inventory.clone(),
        payments.clone(),
        publisher.clone(),
    );
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
    move |m: &Message| {
        let order: Value = m.payload()?;
        let report = saga.run(&order);
        if !report.succeeded() {
            println!("fulfilment: {report}");
            publisher.publish(
                &events,
                "order.compensated",
                Message::encode(&JsonCodec, &order)?,
            )?;
        }
        Ok(Outcome::Accept)
    }
}

/// Inventory: answers `reserve` and `release` requests.
pub struct Inventory {
    service: RunningService,
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
        stop(self.service)
    }
}

pub fn inventory(admin: &Connection, names: &Names) -> Result<Inventory> {
    admin.declare_queue(&QueueSpec::new(&names.inventory).classic())?;
    let stock = Arc::new(Mutex::new(100i64));
    let released = Arc::new(AtomicUsize::new(0));
    let (s, r) = (stock.clone(), released.clone());
    let service = service("inventory").responder(
        &names.inventory,
        ResponderOptions::new(),
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
    );
    Ok(Inventory {
        service: service.start()?,
        stock,
        released,
    })
}

/// Payments: declines a charge over 2,000.00.
pub struct Payments {
    service: RunningService,
}

impl Payments {
    pub fn close(self) -> Result<()> {
        stop(self.service)
    }
}

pub fn payments(admin: &Connection, names: &Names) -> Result<Payments> {
    admin.declare_queue(&QueueSpec::new(&names.payments).classic())?;
    let service = service("payments").responder(
        &names.payments,
        ResponderOptions::new(),
        |m: &Message| -> std::result::Result<&'static str, BoxError> {
            let order: Value = m.payload()?;
            if order["total_cents"].as_i64().unwrap_or(0) > 200_000 {
                return Err(format!("card declined for {}", order["order_id"]).into());
            }
            Ok("charged")
        },
    );
    Ok(Payments {
        service: service.start()?,
    })
}

/// Shipping: retries, and dead-letters an order with an address it does not know.
pub struct Shipping {
    service: RunningService,
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
        stop(self.service)
    }
}

pub fn shipping(admin: &Connection, names: &Names) -> Result<Shipping> {
    admin.declare_queue(&QueueSpec::new(&names.shipping))?;
    let fixed = Arc::new(AtomicBool::new(false));
    let (f, events) = (fixed.clone(), names.events.clone());
    let policy = RetryPolicy::exponential()
        .max_attempts(3)
        .initial_delay(Duration::from_millis(50))
        .max_delay(Duration::from_millis(200));
    let queue = names.shipping.clone();
    // A consumer that publishes: a part of its own, with a publisher on the publishing
    // connection.
    let service = service("shipping")
        .part(format!("consumer:{queue}"), move |c: &Connections| {
            let publisher = c.publishing().publisher()?;
            let consumer = c
                .consuming()
                .consumer(&queue, ConsumerOptions::new().retry(policy))?
                .start(move |m: &Message| {
                    let order: Value = m.payload()?;
                    if order["address"] == "nowhere" && !f.load(Ordering::SeqCst) {
                        let why = format!("no such address for {}", order["order_id"]);
                        return Err(FatalError::new(why).into());
                    }
                    let shipped = Message::encode(&JsonCodec, &order)?;
                    publisher.publish(&events, "order.shipped", shipped)?;
                    Ok(Outcome::Accept)
                })?;
            Ok(Box::new(consumer) as Box<dyn ServicePart>)
        })
        .start()?;
    Ok(Shipping {
        service,
        fixed,
        queue: names.shipping.clone(),
    })
}

/// Notifications: counts what customers are told.
pub struct Notifications {
    service: RunningService,
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
        stop(self.service)
    }
}

pub fn notifications(admin: &Connection, names: &Names) -> Result<Notifications> {
    admin.declare_queue(&QueueSpec::new(&names.notifications))?;
    admin.bind(
        &Binding::new()
            .queue(&names.notifications)
            .exchange(&names.events)
            .routing_key("order.shipped"),
    )?;
    admin.bind(
        &Binding::new()
            .queue(&names.notifications)
            .exchange(&names.events)
            .routing_key("order.compensated"),
    )?;
    let (shipped, compensated) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (s, c) = (shipped.clone(), compensated.clone());
    let service = service("notifications").consumer(
        &names.notifications,
        ConsumerOptions::new(),
        move |m: &Message| {
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
        },
    );
    Ok(Notifications {
        service: service.start()?,
        shipped,
        compensated,
    })
}
