//! `sql::CheckIdle` on a real PostgreSQL server: the health check on checkout runs only for a
//! connection idle longer than the window, a connection the server killed is still replaced,
//! and one killed within the window fails one operation, then is replaced.

mod support;
use support::db;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq_amqp::sql::{CheckIdle, PostgresConnectionManager, Sql};
use acemq_amqp::Error;
use r2d2::ManageConnection;

/// PostgreSQL's manager, counting the health checks it is asked to run.
#[derive(Debug)]
struct Counting {
    inner: PostgresConnectionManager<postgres::NoTls>,
    checks: Arc<AtomicUsize>,
}

impl ManageConnection for Counting {
    type Connection = postgres::Client;
    type Error = postgres::Error;

    fn connect(&self) -> Result<postgres::Client, postgres::Error> {
        self.inner.connect()
    }
    fn is_valid(&self, conn: &mut postgres::Client) -> Result<(), postgres::Error> {
        self.checks.fetch_add(1, Ordering::SeqCst);
        self.inner.is_valid(conn)
    }
    fn has_broken(&self, conn: &mut postgres::Client) -> bool {
        self.inner.has_broken(conn)
    }
}

/// A pool of one connection (health check on checkout on, r2d2's default) and its check count.
fn counted_pool(window: Duration) -> (r2d2::Pool<CheckIdle<Counting>>, Arc<AtomicUsize>) {
    drop(db::pg_client()); // fails, with how to start it, when the server is not there
    let checks = Arc::new(AtomicUsize::new(0));
    let config: postgres::Config = db::PG_URL.parse().unwrap();
    let manager = CheckIdle::new(Counting {
        inner: PostgresConnectionManager::new(config, postgres::NoTls),
        checks: checks.clone(),
    })
    .window(window);
    let pool = r2d2::Pool::builder()
        .max_size(1)
        .connection_timeout(Duration::from_secs(30))
        .build(manager)
        .unwrap();
    (pool, checks)
}

fn backend_pid(conn: &mut dyn Sql) -> acemq_amqp::Result<i64> {
    let rows = conn.query("SELECT pg_backend_pid()", &[])?;
    Ok(rows[0][0].as_i64().expect("an integer pid"))
}

/// Terminates the server process behind `pid` and waits until it is gone.
fn kill_backend(pid: i64) {
    let mut admin = db::pg_client();
    let pid = i32::try_from(pid).unwrap();
    admin
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .unwrap();
    assert!(
        support::eventually(Duration::from_secs(30), || {
            admin
                .query("SELECT 1 FROM pg_stat_activity WHERE pid = $1", &[&pid])
                .unwrap()
                .is_empty()
        }),
        "the server process {pid} did not end"
    );
}

#[test]
fn a_connection_given_back_within_the_window_is_handed_out_without_the_health_check() {
    let (pool, checks) = counted_pool(Duration::from_secs(3600));
    let first = backend_pid(&mut pool.get().unwrap()).unwrap();
    for _ in 0..10 {
        let mut conn = pool.get().unwrap();
        assert_eq!(
            backend_pid(&mut conn).unwrap(),
            first,
            "the same connection"
        );
    }
    assert_eq!(checks.load(Ordering::SeqCst), 0, "no checkout was checked");

    // A zero window checks every checkout, as the inner manager alone does.
    let (pool, checks) = counted_pool(Duration::ZERO);
    for _ in 0..10 {
        backend_pid(&mut pool.get().unwrap()).unwrap();
    }
    assert_eq!(checks.load(Ordering::SeqCst), 10);
}

#[test]
fn a_connection_the_server_killed_while_it_sat_idle_past_the_window_is_replaced_on_checkout() {
    let (pool, checks) = counted_pool(Duration::ZERO);
    let first = backend_pid(&mut pool.get().unwrap()).unwrap();
    kill_backend(first);
    // Checked (idle past the window), found dead, replaced: the caller never sees it.
    let mut conn = pool.get().unwrap();
    let second = backend_pid(&mut conn).unwrap();
    assert_ne!(second, first);
    assert!(checks.load(Ordering::SeqCst) >= 1);
}

#[test]
fn a_connection_the_server_killed_within_the_window_fails_one_operation_then_is_replaced() {
    let (pool, checks) = counted_pool(Duration::from_secs(3600));
    let first = backend_pid(&mut pool.get().unwrap()).unwrap();
    kill_backend(first);
    // Not checked (given back a moment ago): the one operation that gets it fails with the
    // driver's error...
    let failed = backend_pid(&mut pool.get().unwrap());
    assert!(
        matches!(failed, Err(Error::Sql { .. })),
        "expected the driver's error, got {failed:?}"
    );
    // ...and the pool, told it is broken as it comes back, drops it.
    let second = backend_pid(&mut pool.get().unwrap()).unwrap();
    assert_ne!(second, first);
    assert_eq!(checks.load(Ordering::SeqCst), 0);
}

/// A pooled PostgreSQL connection that cannot be made says why (issue 37 item 2): r2d2 keeps
/// only its manager's error text, and the driver's is "error connecting to server" without the
/// cause, so `CheckIdle` hands r2d2 the error with its causes in its text.
#[test]
fn a_pool_that_cannot_reach_postgres_says_the_connection_was_refused() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = closed.local_addr().expect("its address").port();
    drop(closed);
    let config: postgres::Config = format!("host=127.0.0.1 port={port} user=postgres dbname=test")
        .parse()
        .expect("a config");
    let pool = r2d2::Pool::builder()
        .max_size(1)
        .connection_timeout(Duration::from_secs(2))
        .build_unchecked(CheckIdle::new(PostgresConnectionManager::new(
            config,
            postgres::NoTls,
        )));
    let error = match pool.get() {
        Ok(_) => panic!("a connection on port {port}, where nothing listens"),
        Err(e) => Error::from(e),
    };
    let text = error.to_string().to_lowercase();
    assert!(
        text.contains("refused"),
        "the pool's error names the cause: {error}"
    );
}
