//! The conformance suite every transport runs: one body per case, run through the seam on each
//! transport under test ([`CANDIDATES`]) and on the reference, the real RabbitMQ over AMQP
//! (`ACEMQ_TEST_AMQP_URL`, which must be set; a test fails when it is
//! unreachable), for what RabbitMQ shows deterministically. A candidate follows the reference's
//! major (its `version` server property; else `rabbitmq_major()` asks
//! `$ACEMQ_TEST_RABBITMQCTL version`), so each body runs against 3.10 in 3.x mode and against
//! 4.x in 4.x mode. Each body asserts what it must and returns what it saw (texts and codes
//! included); each candidate's observations must equal the reference's. A new transport is one
//! more entry in [`CANDIDATES`]. The cases: `arguments`, `consumers`, `messages`, `quorum`, `topology`.

mod arguments;
mod consumers;
mod messages;
mod quorum;
mod topology;

use std::time::{Duration, Instant};

use crate::transport::amqp::AmqpTransport;
use crate::transport::{
    AmqpError, AmqpProperties, AmqpValue, Channel, Delivery, FieldTable, Publish,
    QueueDeclareOptions, QueueDeleteOptions, Transport,
};

/// One call tried on a fresh channel.
pub(super) type Attempt<'a, T> = Box<dyn Fn(&Channel) -> Result<T, AmqpError> + 'a>;

/// The real broker's URL: `ACEMQ_TEST_AMQP_URL` (scripts/test sets it for each RabbitMQ
/// major); unset, the case fails saying so rather than testing whatever listens on 5672.
pub(super) fn real_url() -> String {
    match std::env::var("ACEMQ_TEST_AMQP_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "ACEMQ_TEST_AMQP_URL is not set: run the tests with `scripts/test`, which sets it \
             for each RabbitMQ major, or set it to the reference broker"
        ),
    }
}

fn open_real() -> amiquip::Connection {
    let url = real_url();
    amiquip::Connection::insecure_open(&url)
        .unwrap_or_else(|e| panic!("RabbitMQ at {url} is needed: {e}"))
}

/// The real broker's major version (3 or 4), read once per test binary: the `version` its
/// connection announces, else what `rabbitmqctl version` says (the command line in
/// `ACEMQ_TEST_RABBITMQCTL`, default `rabbitmqctl`).
pub(super) fn rabbitmq_major() -> u8 {
    static MAJOR: std::sync::OnceLock<u8> = std::sync::OnceLock::new();
    *MAJOR.get_or_init(|| {
        let connection = open_real();
        let announced = match connection.server_properties().get("version") {
            Some(amiquip::AmqpValue::LongString(v)) => major_of(v),
            _ => None,
        };
        let _ = connection.close();
        announced.unwrap_or_else(|| {
            let v = rabbitmqctl_version();
            major_of(&v).unwrap_or_else(|| panic!("cannot read a RabbitMQ version from {v:?}"))
        })
    })
}

fn major_of(version: &str) -> Option<u8> {
    version.trim().split('.').next()?.parse().ok()
}

fn rabbitmqctl_version() -> String {
    let line = std::env::var("ACEMQ_TEST_RABBITMQCTL")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .unwrap_or_else(|| "rabbitmqctl".into());
    let mut words = line.split_whitespace();
    let program = words.next().expect("a command line");
    let out = std::process::Command::new(program)
        .args(words)
        .arg("version")
        .output()
        .unwrap_or_else(|e| panic!("cannot run `{line} version`: {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A transport under test: its name, and how to connect to its broker `instance` (one per
/// case and run), which follows RabbitMQ's `major`.
pub(super) struct Candidate {
    name: &'static str,
    open: fn(instance: &str, major: u8) -> Box<dyn Transport>,
}

/// The transports under test.
pub(super) const CANDIDATES: &[Candidate] = &[Candidate {
    name: "memory",
    open: |instance, major| {
        super::memory::broker(instance).set_major(major);
        super::memory::connect(instance, None)
            .expect("memory connect")
            .0
    },
}];

/// One side of a case: a candidate's broker or the reference, and the names to delete at the
/// end.
pub(super) struct Side {
    /// The candidate and its broker's instance name; `None` for the reference.
    candidate: Option<(&'static Candidate, String)>,
    case: String,
    stamp: String,
    queues: std::cell::RefCell<Vec<String>>,
    exchanges: std::cell::RefCell<Vec<String>>,
}

impl Side {
    fn new(candidate: Option<&'static Candidate>, case: &str) -> Side {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let stamp = format!("{}.{nanos}", std::process::id());
        let candidate = candidate.map(|c| (c, format!("contract.{case}.{stamp}")));
        Side {
            candidate,
            case: case.to_string(),
            stamp,
            queues: Default::default(),
            exchanges: Default::default(),
        }
    }

    pub(super) fn connect(&self) -> Box<dyn Transport> {
        match &self.candidate {
            Some((c, instance)) => (c.open)(instance, rabbitmq_major()),
            None => Box::new(AmqpTransport(open_real())),
        }
    }

    /// The RabbitMQ major both sides follow (the real broker's): for a wait whose end differs.
    pub(super) fn major(&self) -> u8 {
        rabbitmq_major()
    }

    /// A unique queue name (deleted at the end); `short` is what observations show.
    pub(super) fn queue(&self, short: &str) -> String {
        let n = format!("test.mem.{}.{short}.{}", self.case, self.stamp);
        self.queues.borrow_mut().push(n.clone());
        n
    }

    pub(super) fn exchange(&self, short: &str) -> String {
        let n = format!("test.mem.{}.{short}.{}", self.case, self.stamp);
        self.exchanges.borrow_mut().push(n.clone());
        n
    }

    /// A text with this side's names shortened back (`test.mem.case.q.stamp` → `q`).
    pub(super) fn plain(&self, s: &str) -> String {
        let mut out = s.replace(&format!(".{}", self.stamp), "");
        out = out.replace(&format!("test.mem.{}.", self.case), "");
        out
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        let mut t = self.connect();
        if let Ok(ch) = t.open_channel() {
            for q in self.queues.borrow().iter() {
                let _ = ch.queue_delete(q, QueueDeleteOptions::default());
            }
            for x in self.exchanges.borrow().iter() {
                let _ = ch.exchange_delete(x, false);
            }
            let _ = ch.close();
        }
        let _ = t.close();
    }
}

/// Runs `body` on every candidate and on RabbitMQ; each candidate's observations must equal
/// RabbitMQ's.
pub(super) fn both(case: &str, body: impl Fn(&Side) -> Vec<String>) {
    let real = Side::new(None, case);
    let seen_real = body(&real);
    drop(real);
    for candidate in CANDIDATES {
        let side = Side::new(Some(candidate), case);
        let seen = body(&side);
        drop(side);
        assert_eq!(
            seen, seen_real,
            "{} (left) and RabbitMQ (right) differ",
            candidate.name
        );
    }
}

/// An error as observed: a channel refusal's code and text, else the variant (a lost link's
/// reason is each transport's own words).
pub(super) fn seen(side: &Side, e: AmqpError) -> String {
    match e {
        AmqpError::ServerClosedChannel { code, message, .. } => {
            format!("{code} {}", side.plain(&message))
        }
        AmqpError::LinkLost { .. } => "LinkLost".into(),
        e => format!("{e:?}"),
    }
}

pub(crate) fn args(pairs: &[(&str, AmqpValue)]) -> FieldTable {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

pub(crate) fn declare(ch: &Channel, q: &str, arguments: FieldTable) {
    ch.queue_declare(
        q,
        QueueDeclareOptions {
            arguments,
            ..Default::default()
        },
    )
    .expect("declare");
}

pub(crate) fn send(ch: &Channel, exchange: &str, key: &str, body: &str, props: AmqpProperties) {
    ch.basic_publish(
        exchange,
        Publish::with_properties(body.as_bytes(), key, props),
    )
    .expect("publish");
}

/// `basic.get` until something comes or the deadline passes (a publish is asynchronous).
pub(super) fn get_within(ch: &Channel, q: &str, no_ack: bool) -> Option<crate::transport::Get> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(g) = ch.basic_get(q, no_ack).expect("get") {
            return Some(g);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::yield_now();
    }
}

/// Waits (deadline 5 s) until the queue's depth is `n`.
pub(super) fn wait_depth(ch: &Channel, q: &str, n: u32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let depth = ch
            .queue_declare_passive(q)
            .expect("passive")
            .message_count();
        if depth == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{q}: depth {depth}, waited for {n}"
        );
        std::thread::yield_now();
    }
}

pub(super) fn body_of(d: &Delivery) -> String {
    String::from_utf8_lossy(&d.body).into_owned()
}

/// A header value's shape: its type, and its value except for times.
fn shape(side: &Side, v: &AmqpValue) -> String {
    match v {
        AmqpValue::Timestamp(_) => "timestamp".into(),
        AmqpValue::LongString(s) => format!("'{}'", side.plain(s)),
        AmqpValue::FieldArray(a) => {
            let items: Vec<String> = a.iter().map(|v| shape(side, v)).collect();
            format!("[{}]", items.join(", "))
        }
        AmqpValue::FieldTable(t) => {
            let items: Vec<String> = t
                .iter()
                .map(|(k, v)| format!("{k}: {}", shape(side, v)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        v => format!("{v:?}"),
    }
}

pub(super) fn headers_shape(side: &Side, d: &Delivery) -> Vec<String> {
    let mut out = vec![format!("expiration {:?}", d.properties.expiration())];
    if let Some(h) = d.properties.headers() {
        for (k, v) in h {
            out.push(format!("{k} = {}", shape(side, v)));
        }
    }
    out
}

#[test]
fn a_version_is_read_as_its_major() {
    assert_eq!(major_of("4.0.5"), Some(4));
    assert_eq!(major_of("3.10.8\n"), Some(3));
    assert_eq!(major_of("Error: unable to perform an operation"), None);
}
