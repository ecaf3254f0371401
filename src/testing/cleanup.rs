//! [`Cleanup`]: deletes what a test declared when it is dropped, also when the test panics.

use std::io::Write;
use std::time::{Duration, Instant};

use crate::connection::ConnectionOptions;

/// How long one try waits to reach the broker.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the clean-up keeps trying, by default.
const DEADLINE: Duration = Duration::from_secs(30);

/// The longest pause between two tries.
const MAX_PAUSE: Duration = Duration::from_secs(2);

/// A clean-up action registered with [`Cleanup::on_drop`].
type Action = Box<dyn FnOnce() + Send>;

/// Deletes the queues, exchanges and tables a test declared when it is dropped — at the end of
/// the test, and also when the test panics (unwinding drops it). A queue goes with the failure
/// queues a consumer of it declares (`{queue}.dlq`, `{queue}.parked`; the retry rungs through
/// [`consumed_queue`](Cleanup::consumed_queue)), so a test that starts a consumer leaves none.
///
/// Register each name as it is made (every method returns the name, so it can wrap the name
/// where it is chosen):
///
/// ```no_run
/// use acemq_amqp::testing::{Cleanup, TestNames};
/// use acemq_amqp::{Connection, QueueSpec};
///
/// # fn main() -> acemq_amqp::Result<()> {
/// // The broker the test run is given (each RabbitMQ major in turn).
/// let url = std::env::var("ACEMQ_TEST_AMQP_URL").expect("the broker under test");
/// let names = TestNames::current();
/// let mut cleanup = Cleanup::new(&url);
/// let queue = cleanup.queue(&names.queue("orders"));
/// let connection = Connection::open(&url)?;
/// connection.declare_queue(&QueueSpec::new(&queue))?;
/// // … the test; `queue` is deleted when `cleanup` is dropped, even if this panics.
/// # Ok(()) }
/// ```
///
/// On drop it opens a connection of its own to `url` (the test's may be closed or cut by then),
/// deletes the queues, then the exchanges, then runs the other actions (tables) in reverse
/// order of registration. A busy broker may not answer the first try: what could not be
/// deleted is tried again on a new connection, with pauses growing to 2 s, until its
/// [`deadline`](Cleanup::deadline) (30 s by default). An exclusive queue whose connection is
/// still open is left to it (the broker lets only that connection delete it, and deletes it
/// when that connection closes). Nothing in it panics: what is still left
/// at the deadline (the broker unreachable) is written to the process's standard error — past
/// the test harness's capture, so a run's log shows it even when the test passed — and the
/// rest is still attempted; a table that cannot be dropped is reported on standard error,
/// where the harness shows it with the failing test. It blocks while it deletes.
pub struct Cleanup {
    url: String,
    deadline: Duration,
    queues: Vec<String>,
    exchanges: Vec<String>,
    actions: Vec<(String, Action)>,
}

impl std::fmt::Debug for Cleanup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let actions: Vec<&str> = self.actions.iter().map(|(what, _)| what.as_str()).collect();
        f.debug_struct("Cleanup")
            .field("queues", &self.queues)
            .field("exchanges", &self.exchanges)
            .field("actions", &actions)
            .finish_non_exhaustive()
    }
}

impl Cleanup {
    /// A clean-up that deletes through the broker at `url` (an AMQP URL, as given to
    /// [`Connection::open`](crate::Connection::open)).
    pub fn new(url: impl Into<String>) -> Cleanup {
        Cleanup {
            url: url.into(),
            deadline: DEADLINE,
            queues: Vec::new(),
            exchanges: Vec::new(),
            actions: Vec::new(),
        }
    }

    /// How long the deletes on the broker are tried at the end (30 s by default): a test that
    /// expects an unreachable broker sets a short one.
    pub fn deadline(mut self, deadline: Duration) -> Cleanup {
        self.deadline = deadline;
        self
    }

    /// Deletes queue `name` at the end with the failure queues a consumer of it declares,
    /// `{name}.dlq` and `{name}.parked` (whether a consumer ran on it or not); returns the name.
    ///
    /// A consumer whose policy waits on the broker also declares a retry rung per wait
    /// (`{name}.retry.{Ns|Nm|Nh}`), which the queue's name alone does not tell: register such
    /// a queue with [`consumed_queue`](Self::consumed_queue) and the policy's
    /// [`broker_rungs`](crate::RetryPolicy::broker_rungs).
    pub fn queue(&mut self, name: &str) -> String {
        self.consumed_queue(name, &[])
    }

    /// Deletes consumed queue `name` at the end with everything a consumer declares beside it
    /// ([`failure_topology`](crate::failure_topology)): `{name}.dlq`, `{name}.parked` and the
    /// retry rung of each delay in `rungs` (`{name}.retry.{Ns|Nm|Nh}`; pass the policy's
    /// [`broker_rungs`](crate::RetryPolicy::broker_rungs), none for a policy that holds every
    /// wait in the consumer). The queue is deleted first, then its failure queues. The shared
    /// exchanges (`acemq.dlx`, `acemq.retry`) are left: other queues' bindings use them.
    /// Returns the name.
    pub fn consumed_queue(&mut self, name: &str, rungs: &[Duration]) -> String {
        self.queues.push(name.to_string());
        for q in crate::failure_topology(name, rungs).queues {
            self.queues.push(q.name().to_string());
        }
        name.to_string()
    }

    /// Deletes exchange `name` at the end (after the queues); returns the name.
    pub fn exchange(&mut self, name: &str) -> String {
        self.exchanges.push(name.to_string());
        name.to_string()
    }

    /// Drops table `name` at the end (`DROP TABLE IF EXISTS`), on a connection `connect`
    /// opens then; returns the name.
    ///
    /// # Panics
    ///
    /// At once, when `name` is not a plain SQL identifier (it is concatenated into SQL).
    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
    pub fn table<F, C>(&mut self, name: &str, connect: F) -> String
    where
        F: FnOnce() -> crate::Result<C> + Send + 'static,
        C: crate::sql::Sql,
    {
        let name = name.to_string();
        if let Err(e) = crate::sql::check_identifier(&name) {
            panic!("Cleanup::table: {e}");
        }
        let table = name.clone();
        self.on_drop(format!("dropping table {name}"), move || {
            let dropped = connect().and_then(|mut c| {
                c.execute(&format!("DROP TABLE IF EXISTS {table}"), &[])
                    .map(drop)
            });
            if let Err(e) = dropped {
                eprintln!("acemq cleanup: could not drop table {table}: {e}");
            }
        });
        name
    }

    /// Runs `action` at the end (after the queues and exchanges are deleted; actions run in
    /// reverse order of registration). `what` names it in the `Debug` output. A panic in it is
    /// caught and reported; the other actions still run.
    pub fn on_drop(&mut self, what: impl Into<String>, action: impl FnOnce() + Send + 'static) {
        self.actions.push((what.into(), Box::new(action)));
    }

    /// The queues it will delete.
    pub fn queues(&self) -> &[String] {
        &self.queues
    }

    /// The exchanges it will delete.
    pub fn exchanges(&self) -> &[String] {
        &self.exchanges
    }

    fn delete_on_broker(&mut self) {
        let end = Instant::now() + self.deadline;
        let mut pause = Duration::from_millis(100);
        let mut last = String::new();
        while !(self.queues.is_empty() && self.exchanges.is_empty()) {
            if let Some(failure) = self.try_deletes() {
                last = failure;
            }
            if self.queues.is_empty() && self.exchanges.is_empty() {
                return;
            }
            if Instant::now() + pause >= end {
                let _ = writeln!(
                    std::io::stderr(),
                    "acemq cleanup: gave up after {:?} ({last}); left behind: queues {:?}, \
                     exchanges {:?}",
                    self.deadline,
                    self.queues,
                    self.exchanges
                );
                return;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }

    /// One try on a new connection: deletes what it can (a name the broker does not know is
    /// done) and keeps the rest; the last failure, if any.
    fn try_deletes(&mut self) -> Option<String> {
        let options = ConnectionOptions::new()
            .address(self.url.as_str())
            .name("acemq-test-cleanup")
            .connect_timeout(CONNECT_TIMEOUT);
        let connection = match crate::Connection::open_with(options) {
            Ok(c) => c,
            Err(e) => return Some(format!("cannot reach the broker: {e}")),
        };
        let mut failure = None;
        self.queues.retain(|q| match connection.delete_queue(q) {
            Ok(_) | Err(crate::Error::NotFound { .. }) => false,
            // Exclusive to a connection still open (405 RESOURCE_LOCKED): only that one may
            // delete it, and it goes when that one closes — nothing left behind, nothing to
            // try again.
            Err(crate::Error::Amqp { source, .. }) if source.reply_code() == Some(405) => false,
            Err(e) => {
                failure = Some(format!("could not delete queue {q}: {e}"));
                true
            }
        });
        self.exchanges
            .retain(|x| match connection.delete_exchange(x) {
                Ok(()) | Err(crate::Error::NotFound { .. }) => false,
                Err(e) => {
                    failure = Some(format!("could not delete exchange {x}: {e}"));
                    true
                }
            });
        let _ = connection.close();
        failure
    }
}

impl Drop for Cleanup {
    /// Deletes everything registered; blocks while it does. Never panics.
    fn drop(&mut self) {
        self.delete_on_broker();
        while let Some((what, action)) = self.actions.pop() {
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(action));
            if let Err(panic) = run {
                eprintln!(
                    "acemq cleanup: {what} panicked: {}",
                    crate::error::panic_message(&*panic)
                );
            }
        }
    }
}
